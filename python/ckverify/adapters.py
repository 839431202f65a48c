"""Adapters shipped with ckverify for checkpoint APIs whose calling convention is not a plain function.

Each is used as ``--impl py:ckverify.adapters:NAME[:opts]``; each is a function in the bridge's ``function``
convention unless it names another (``ckverify_convention``).

``torch_checkpoint(segment, *args, recompute_aware=True, **kw)``
    ``torch.utils.checkpoint.checkpoint(segment, *args, use_reentrant=False, context_fn=..., **kw)`` whose
    context_fn marks the recompute (``ckverify.recompute_aware_context``): torch's non-reentrant checkpoint
    adopting the side-effect contract, so it is gated on ``fx=`` Cases too. ``recompute_aware=false``
    gives torch's checkpoint as it is. Where the segment shows generators besides the defaults
    (``segment.generators``: a model-parallel tracker's streams), the non-reentrant checkpoint also
    replays them (``ckverify.replay_generators_context``), as torch replays only the default generators;
    ``use_reentrant=true`` cannot (no context_fn), and draws other masks from them in the recompute.

``selective(segment, *args, ops=[...], recompute_aware=True, **kw)``
    torch's selective activation checkpointing (``create_selective_checkpoint_contexts``) with a policy given
    as an op list: the outputs of the listed ops (``"aten.mm.default"``, ``"aten.addmm"``: an overload or
    every overload of a packet) are saved, everything else is recomputed; ``ops=[]`` recomputes every op.
    ``segment.generators`` are replayed as with ``torch_checkpoint``.

``checkpoint_sequential(blocks, x, segments=2, **kw)`` (a strategy: ``--strategy``)
    ``torch.utils.checkpoint.checkpoint_sequential(blocks, segments, x, **kw)``, whose parameters come in
    another order than a strategy's ``(blocks, x)``; ``segments`` is capped at the number of blocks.

``deepspeed(segment, *args, reentrant=True, cpu_streams=False, **configure_options)``
    DeepSpeed's activation checkpointing as a DeepSpeed model calls it: ``deepspeed.checkpointing.configure(
    None, **configure_options)`` after ``deepspeed.init_distributed`` (a one-process Gloo group, as
    ``deepspeed.initialize`` makes one) (``partition_activations``, ``contiguous_checkpointing``,
    ``num_checkpoints``, ``checkpoint_in_cpu``, ``synchronize``, ``profile``; again whenever they change),
    then ``deepspeed.checkpointing.checkpoint`` (``reentrant=true``, DeepSpeed's default) or
    ``non_reentrant_checkpoint``. DeepSpeed 0.17 cannot checkpoint on its CPU accelerator at all: both
    functions call ``get_accelerator().Stream(...)``, which the CPU accelerator defines as ``None``.
    ``cpu_streams=true`` gives the CPU accelerator a ``Stream`` that returns no stream (what its
    ``stream()`` context already expects), the one change needed to gate the rest of DeepSpeed's
    checkpoint on CPU; ckverify changes nothing else in DeepSpeed.

``transformers(segment, gradient_checkpointing_kwargs=None, offload=False)`` (a wrapper: it names its convention)
    Hugging Face transformers' gradient checkpointing as a model enables it: the segment runs as a
    ``transformers.modeling_layers.GradientCheckpointingLayer`` inside a ``PreTrainedModel`` on which
    ``gradient_checkpointing_enable(gradient_checkpointing_kwargs)`` was called, in training mode, so the
    layer's own ``__call__`` checkpoints it (``None`` is transformers' default, ``{"use_reentrant": true}``).
    ``offload=true`` runs each layer call under ``torch.autograd.graph.save_on_cpu`` (activation offload).
"""

import torch
import torch.utils.checkpoint as _tc

import ckverify


def _op(name):
    if not isinstance(name, str) or not name.startswith("aten."):
        raise ValueError("selective: an op is named as in aten.mm.default or aten.mm, got %r" % (name,))
    parts = name.split(".")
    packet = getattr(torch.ops.aten, parts[1], None)
    if packet is None:
        raise ValueError("selective: torch has no op %s" % name)
    if len(parts) == 2:
        return [getattr(packet, o) for o in packet.overloads()]
    overload = getattr(packet, parts[2], None)
    if overload is None:
        raise ValueError("selective: torch has no overload %s" % name)
    return [overload]


def torch_checkpoint(segment, *args, recompute_aware=True, **kw):
    kw.setdefault("use_reentrant", False)
    fns = [ckverify.recompute_aware_context] if recompute_aware else []
    if getattr(segment, "generators", None) and not kw["use_reentrant"]:
        fns.append(ckverify.replay_generators_context(segment))  # torch replays only the default generators
    if "context_fn" in kw:
        fns.append(kw["context_fn"])
    if fns:
        kw["context_fn"] = ckverify.compose_contexts(*fns)
    return _tc.checkpoint(segment, *args, **kw)


def selective(segment, *args, ops=None, recompute_aware=True, **kw):
    if ops is None:
        raise TypeError("selective needs ops=[...] (the ops whose outputs are saved), e.g. ops=[\"aten.mm.default\"]")
    if isinstance(ops, str):
        ops = [ops]
    saved = [o for name in ops for o in _op(name)]
    policy = lambda: _tc.create_selective_checkpoint_contexts(saved)
    fns = [policy] + ([ckverify.recompute_aware_context] if recompute_aware else [])
    if getattr(segment, "generators", None):
        fns.append(ckverify.replay_generators_context(segment))
    return _tc.checkpoint(segment, *args, use_reentrant=False, context_fn=ckverify.compose_contexts(*fns), **kw)


def _validate_torch_checkpoint(recompute_aware=True, use_reentrant=False, **_):
    if recompute_aware and use_reentrant:
        raise ValueError("torch's reentrant checkpoint takes no context_fn, so it cannot mark its recomputes: "
                         "use_reentrant=true needs recompute_aware=false")


torch_checkpoint.ckverify_validate = _validate_torch_checkpoint


def _validate_selective(ops=None, **_):
    if ops is None:
        raise ValueError("selective needs ops=[...] (the ops whose outputs are saved), e.g. ops=[\"aten.mm.default\"]")
    for name in [ops] if isinstance(ops, str) else ops:
        _op(name)


# The bridge calls a callable's ckverify_validate(**options) when it loads the spec: a bad option is the
# CLI's one-line error (exit 2) before any Case runs, not a failure of every Case.
selective.ckverify_validate = _validate_selective


def checkpoint_sequential(blocks, x, segments=2, **kw):
    kw.setdefault("use_reentrant", False)
    return _tc.checkpoint_sequential(blocks, max(1, min(segments, len(blocks))), x, **kw)


checkpoint_sequential.ckverify_convention = "strategy"


# --- DeepSpeed ------------------------------------------------------------------------------------------

_DS_CONFIGURE = ("partition_activations", "contiguous_checkpointing", "num_checkpoints", "checkpoint_in_cpu",
                 "synchronize", "profile")
_ds_configured = [None]  # the configure() options last applied


def _no_stream(*_, **__):
    return None


def deepspeed(segment, *args, reentrant=True, cpu_streams=False, **configure):
    import deepspeed as ds
    from deepspeed.accelerator import get_accelerator

    if cpu_streams:
        accelerator = get_accelerator()
        if accelerator.device_name() == "cpu" and accelerator.Stream is None:
            type(accelerator).Stream = property(lambda self: _no_stream)
    if not ds.comm.is_initialized():
        # As deepspeed.initialize() does first: a one-process Gloo group (this worker is rank 0 of 1),
        # rendezvous through a file of this process's own, so parallel workers never share a port.
        import tempfile

        store = tempfile.mkdtemp(prefix="ckverify-deepspeed-")
        ds.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, init_method="file://%s/store" % store,
                            rank=0, world_size=1)
    key = tuple(sorted(configure.items()))
    if _ds_configured[0] != key:
        ds.checkpointing.configure(None, **configure)
        _ds_configured[0] = key
    fn = ds.checkpointing.checkpoint if reentrant else ds.checkpointing.non_reentrant_checkpoint
    return fn(segment, *args)


def _validate_deepspeed(reentrant=True, cpu_streams=False, **configure):
    unknown = sorted(set(configure) - set(_DS_CONFIGURE))
    if unknown:
        raise ValueError("deepspeed: %s not an option of deepspeed.checkpointing.configure (known: %s)" %
                         (", ".join(unknown), ", ".join(_DS_CONFIGURE)))
    import deepspeed  # noqa: F401  (an install problem is the spec's one-line error)


deepspeed.ckverify_validate = _validate_deepspeed


# --- transformers -------------------------------------------------------------------------------------

_hf_classes = []


def _hf():
    if not _hf_classes:
        from transformers import PretrainedConfig, PreTrainedModel
        from transformers.modeling_layers import GradientCheckpointingLayer

        class Layer(GradientCheckpointingLayer):
            def __init__(self, segment, offload):
                super().__init__()
                self.segment, self.offload = segment, offload

            def __call__(self, *args, **kwargs):
                if not self.offload:
                    return super().__call__(*args, **kwargs)
                with torch.autograd.graph.save_on_cpu(pin_memory=False):
                    return super().__call__(*args, **kwargs)

            def forward(self, *args):
                return self.segment(*args)

        class Model(PreTrainedModel):
            config_class = PretrainedConfig
            supports_gradient_checkpointing = True

            def __init__(self, config, segment, offload):
                super().__init__(config)
                self.layer = Layer(segment, offload)  # no post_init(): the segment's weights are the Case's

        _hf_classes.extend([Model, PretrainedConfig])
    return _hf_classes


def transformers(segment, gradient_checkpointing_kwargs=None, offload=False):
    Model, PretrainedConfig = _hf()
    model = Model(PretrainedConfig(), segment, offload)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)
    model.train()
    return model.layer


def _validate_transformers(gradient_checkpointing_kwargs=None, offload=False):
    if gradient_checkpointing_kwargs is not None and not isinstance(gradient_checkpointing_kwargs, dict):
        raise ValueError('transformers: gradient_checkpointing_kwargs is a JSON object, e.g. {"use_reentrant":false}')
    _hf()


transformers.ckverify_validate = _validate_transformers
transformers.ckverify_convention = "wrapper"
