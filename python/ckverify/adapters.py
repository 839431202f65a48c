"""Adapters shipped with ckverify for checkpoint APIs whose calling convention is not a plain function.

Each is a function in the bridge's ``function`` convention, used as ``--impl py:ckverify.adapters:NAME[:opts]``.

``torch_checkpoint(segment, *args, recompute_aware=True, **kw)``
    ``torch.utils.checkpoint.checkpoint(segment, *args, use_reentrant=False, context_fn=..., **kw)`` whose
    context_fn marks the recompute (``ckverify.recompute_aware_context``): torch's non-reentrant checkpoint
    adopting the side-effect contract, so it is gated on ``fx=`` Cases too. ``recompute_aware=false``
    gives torch's checkpoint as it is.

``selective(segment, *args, ops=[...], recompute_aware=True, **kw)``
    torch's selective activation checkpointing (``create_selective_checkpoint_contexts``) with a policy given
    as an op list: the outputs of the listed ops (``"aten.mm.default"``, ``"aten.addmm"``: an overload or
    every overload of a packet) are saved, everything else is recomputed; ``ops=[]`` recomputes every op.
"""
import contextlib

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


class _All:
    """Enters several context managers as one; may be entered again (torch re-enters a recompute context)."""

    def __init__(self, managers):
        self.managers, self.stacks = managers, []

    def __enter__(self):
        with contextlib.ExitStack() as stack:
            for m in self.managers:
                stack.enter_context(m)
            self.stacks.append(stack.pop_all())  # entered all: keep them open until __exit__
        return self

    def __exit__(self, *exc):
        return self.stacks.pop().__exit__(*exc)


def _compose(*context_fns):
    def context_fn():
        pairs = [f() for f in context_fns]
        return _All([p[0] for p in pairs]), _All([p[1] for p in pairs])

    return context_fn


def torch_checkpoint(segment, *args, recompute_aware=True, **kw):
    if recompute_aware:
        kw["context_fn"] = _compose(ckverify.recompute_aware_context, *([kw["context_fn"]] if "context_fn" in kw else []))
    kw.setdefault("use_reentrant", False)
    return _tc.checkpoint(segment, *args, **kw)


def selective(segment, *args, ops=None, recompute_aware=True, **kw):
    if ops is None:
        raise TypeError("selective needs ops=[...] (the ops whose outputs are saved), e.g. ops=[\"aten.mm.default\"]")
    if isinstance(ops, str):
        ops = [ops]
    saved = [o for name in ops for o in _op(name)]
    policy = lambda: _tc.create_selective_checkpoint_contexts(saved)
    fns = [policy] + ([ckverify.recompute_aware_context] if recompute_aware else [])
    return _tc.checkpoint(segment, *args, use_reentrant=False, context_fn=_compose(*fns), **kw)


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
