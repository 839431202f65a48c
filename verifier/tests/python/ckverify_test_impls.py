"""Python implementations the Python gate tests run through the bridge (verifier/tests/python_gate_test.sh).

Correct designs that are not torch's checkpoint as it is, and one wrong one:
  clone_per_call      torch's non-reentrant checkpoint over clones of the inputs, recompute-aware:
                      recomputes from its own copies, so an in-place change of an input cannot reach it
  offloaded           torch's reentrant checkpoint under torch.autograd.graph.save_on_cpu: the saved
                      inputs are copies (offloading), so the recompute uses the input the forward saw
  introspect          checks what the bridge passes (a ckverify.Segment with the segment's parameters,
                      index, step and micro-batch) and then checkpoints recompute-aware
  megatron_like       megatron-core's calling convention: (function, distribute_saved_activations, *args)
  forgets_recompute   recompute-aware in the forward only: marks the recompute as a first forward
fails_on_rank raises or aborts on one rank only (bench on ranks must end at once, naming it).
A strategy: grouped, groups of blocks checkpointed with ckverify.checkpoint_context (passes fx= and tp=2).
And two that raise, for the tracebacks in reports: raises_in_recompute (in backward), raises_in_forward;
stateful, correct for its first calls in a process only; and slow_plain, no checkpoint at all, 20 ms a
call (for interrupting a run in the middle).
"""
import tempfile

import torch
import torch.utils.checkpoint as tc

import ckverify


def _aware(segment, *args, **kw):
    return tc.checkpoint(segment, *args, use_reentrant=False, context_fn=ckverify.recompute_aware_context, **kw)


def clone_per_call(segment, *args):
    copies = [a.clone() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    return _aware(segment, *copies)


def leaves_tempdir(segment, *args):
    tempfile.mkdtemp(prefix="left-by-the-implementation-")
    return _aware(segment, *args)


def offloaded(segment, *args):
    with torch.autograd.graph.save_on_cpu(pin_memory=False):
        return tc.checkpoint(segment, *args, use_reentrant=True)


def introspect(segment, *args, segments=None):
    assert isinstance(segment, ckverify.Segment) and isinstance(segment, torch.nn.Module), type(segment)
    assert isinstance(segment.index, int) and segment.index >= 0, segment.index
    assert isinstance(segment.step, int) and segment.step >= 0, segment.step
    assert isinstance(segment.micro, int) and segment.micro >= 0, segment.micro
    if segments is not None:
        assert segment.index < segments, (segment.index, segments)
    params = list(segment.parameters())
    assert params, "a segment of the Case's blocks has parameters"
    names = [n for n, _ in segment.named_parameters()]
    assert len(set(names)) == len(names), names
    assert all(p.dtype == torch.float32 for p in params)
    return _aware(segment, *args)


def megatron_like(function, distribute_saved_activations, *args):
    if not isinstance(distribute_saved_activations, bool):
        raise TypeError("distribute_saved_activations must be a bool, got %s" % type(distribute_saved_activations).__name__)
    return _aware(function, *args)


def _forgetful_context():
    state = ckverify.SegmentState()
    return ckverify.segment_scope(state, False), ckverify.segment_scope(state, False)


def forgets_recompute(segment, *args):
    return tc.checkpoint(segment, *args, use_reentrant=False, context_fn=_forgetful_context)


def one_argument(x):
    """Takes neither (segment, *args) nor (blocks, x): refused up front as a strategy."""
    return x


def checkpoint_after_first_step(blocks, x):
    """A correct strategy whose plan changes: plain in step 0 (a warm-up), every block checkpointed after."""
    for block in blocks:
        x = tc.checkpoint(block, x, use_reentrant=False) if block.step > 0 else block(x)
    return x


def draws_its_own(blocks, x):
    """A wrong strategy: checkpoints every block correctly, but draws a random number of its own first
    (a random choice of what to checkpoint would), which moves the generators the model's dropout reads."""
    torch.rand(1)
    for block in blocks:
        x = tc.checkpoint(block, x, use_reentrant=False)
    return x


def _recompute_failure():
    raise ValueError("raised in the recompute")


def raises_in_recompute(segment, *args):
    """Raises from inside its recompute (in backward), two frames below the checkpointed function."""
    calls = [0]

    def fn(*a):
        calls[0] += 1
        if calls[0] == 2:
            _recompute_failure()
        return segment(*a)

    return tc.checkpoint(fn, *args, use_reentrant=False)


def raises_in_forward(segment, *args):
    """Raises in the forward, before anything is checkpointed."""
    _forward_failure(len(args))


def _forward_failure(n):
    raise KeyError("raised in the forward with %d argument(s)" % n)


_by_shape = {}


def caches_by_shape(segment, *args):
    """Wrong: a call at input shapes seen before, in any Case this process ran, returns that call's
    outputs again, detached (a cache keyed by shape). A Case fails on its own only where two of its
    calls share shapes; after other Cases, any call may."""
    key = tuple(tuple(a.shape) for a in args if torch.is_tensor(a))
    if key in _by_shape:
        return _by_shape[key]
    out = _aware(segment, *args)
    _by_shape[key] = out.detach() if torch.is_tensor(out) else tuple(o.detach() for o in out)
    return out


_calls = [0]


def stateful(segment, *args, after=40):
    """Correct (torch's non-reentrant checkpoint, recompute-aware) for its first `after` calls in the
    process, then it stops preserving the RNG state: a failure only a long-lived process shows."""
    _calls[0] += 1
    return tc.checkpoint(segment, *args, use_reentrant=False, context_fn=ckverify.recompute_aware_context,
                         preserve_rng_state=_calls[0] <= after)


def slow_plain(segment, *args):
    import time

    time.sleep(0.02)
    return segment(*args)


def fails_on_rank(segment, *args, rank=1, how="raise"):
    """torch's non-reentrant checkpoint, except on one rank of a Case run as ranks (CKV_RANK, set by
    ckverify's rank launcher) from step 1 on, where it raises (how=raise) or aborts the process
    (how=abort): the other ranks then wait in a collective that never completes."""
    import os

    if os.environ.get("CKV_RANK") == str(rank) and segment.step >= 1:
        if how == "abort":
            os.abort()
        raise RuntimeError("raised on rank %d only" % rank)
    return tc.checkpoint(segment, *args, use_reentrant=False)


def grouped(blocks, x, size=2):
    """A strategy: the blocks in groups of `size`, each group one non-reentrant checkpoint whose context_fn
    is ckverify.checkpoint_context(*group): its recomputes marked, the groups' generators replayed."""
    for start in range(0, len(blocks), size):
        group = list(blocks[start:start + size])

        def run(h, group=group):
            for b in group:
                h = b(h)
            return h

        x = tc.checkpoint(run, x, use_reentrant=False, context_fn=ckverify.checkpoint_context(*group))
    return x
