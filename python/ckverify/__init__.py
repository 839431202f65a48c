"""ckverify's Python side, imported by the Python bridge (``--impl py:MODULE:CALLABLE``) inside ckverify.

What a Python checkpoint implementation sees and may use:

``Segment``
    The callable a checkpoint function receives in place of the segment: a ``torch.nn.Module`` whose
    ``forward(*args)`` runs the Case's segment. It holds the segment's parameters (``parameters()``,
    ``named_parameters()``, names ``p0, p1, ...``: the very tensors the Case trains, not copies) and
    ``index`` (the segment's index in the plan, stable across steps and micro-batches), ``step`` (the
    optimizer step) and ``micro`` (the micro-batch within the step). ``generators``: the
    ``torch.Generator`` objects the segment draws from besides the devices' default ones (the streams of
    a model-parallel RNG tracker, forked inside the segment; empty without tensor parallelism). A
    checkpoint replays them as it replays the defaults: their states taken before the forward, set
    again for the recompute, and put back after it. ``replay_generators_context(segment)`` does this
    for ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``; the reentrant checkpoint takes no
    ``context_fn`` and cannot.

``Blocks``
    What a strategy (``--strategy py:MODULE:FUNC``, called as ``FUNC(blocks, x, **options)``) receives:
    the Case's block stack as a ``torch.nn.ModuleList`` of ``Segment`` modules, one per block (``index``
    is the block's), so code written for an ``nn.ModuleList`` of blocks runs unchanged (len, indexing,
    slicing, iteration, ``parameters()``, ``requires_grad_``).

``is_recomputing()``, ``SegmentState``, ``segment_scope(state, recomputing)``
    The recompute-awareness contract (verifier/checkpoint/segment_scope.hpp) from Python. Modules with
    side effects (a counter, a log, BatchNorm's running statistics, a cache) apply their effect once per
    forward: a checkpoint marks its first forward with ``segment_scope(state, False)`` and each
    recompute with ``segment_scope(state, True)``, sharing one ``SegmentState`` per checkpointed call.
    An implementation that does so passes Cases with ``fx=`` effects; one that does not fails them,
    which is a true statement about it when such modules are checkpointed.

``recompute_aware_context()``
    A ``context_fn`` for ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` that does exactly
    that: how a framework built on torch's checkpoint adopts the contract in one argument.

``replay_generators_context(segment)``
    A ``context_fn`` for the same that replays ``segment.generators`` in the recompute.

``checkpoint_context(*segments, context_fns=())``
    Both at once, for a checkpoint call that runs ``segments`` (one block, or a group of blocks run as one
    checkpoint): the recompute marked, and every generator the segments show replayed; then any
    ``context_fns`` of the caller's own (a selective-checkpoint policy). Call it for each checkpoint call,
    just before it: ``checkpoint(run, x, use_reentrant=False, context_fn=ckverify.checkpoint_context(*group))``.

``compose_contexts(*context_fns)``
    One ``context_fn`` from several: their forward contexts entered together, and their recompute
    contexts, each pair as one context manager that may be entered again.
"""
import contextlib

import torch

try:  # the native half exists only inside ckverify's embedded interpreter
    import _ckverify_native as _native
except ImportError:  # imported by plain Python (docs, tests of the adapters): no recompute flag to set
    _native = None

__all__ = ["Segment", "Blocks", "SegmentState", "is_recomputing", "segment_scope", "recompute_aware_context",
           "replay_generators_context", "checkpoint_context", "compose_contexts"]


class SegmentState:
    """What one checkpointed call keeps for the modules inside it, from its first forward to its recomputes."""

    __slots__ = ("_native",)

    def __init__(self):
        self._native = _native.SegmentState() if _native is not None else None


def is_recomputing():
    """True while a checkpoint marks the code running on this thread as a recompute."""
    return bool(_native.is_recomputing()) if _native is not None else False


class segment_scope:
    """Runs the block inside the checkpointed call ``state``, as its first forward or as a recompute.

    A context manager that may be entered again (torch enters a checkpoint's recompute context once per
    recompute, and a double backward recomputes twice) and nested.
    """

    def __init__(self, state, recomputing):
        if not isinstance(state, SegmentState):
            raise TypeError("segment_scope expects a ckverify.SegmentState, got " + type(state).__name__)
        self._state, self._recomputing, self._open = state, bool(recomputing), []

    def __enter__(self):
        if _native is not None:
            self._open.append(_native.Scope(self._state._native, self._recomputing))
        return self

    def __exit__(self, *exc):
        if self._open:
            self._open.pop().close()
        return False


def recompute_aware_context():
    """``context_fn`` for torch.utils.checkpoint: the forward and the recompute of one call share a state."""
    state = SegmentState()
    return segment_scope(state, False), segment_scope(state, True)


class _ReplayGenerators:
    """Sets the generators to the given states while entered, and back to what they were after; may be
    entered again (torch enters a recompute context once per recompute)."""

    def __init__(self, generators, states):
        self.generators, self.states, self.saved = generators, states, []

    def __enter__(self):
        self.saved.append([g.get_state() for g in self.generators])
        for g, s in zip(self.generators, self.states):
            g.set_state(s)
        return self

    def __exit__(self, *exc):
        for g, s in zip(self.generators, self.saved.pop()):
            g.set_state(s)
        return False


def _generators_of(segments):
    """The generators the segments show, each once (the blocks of one tracker share its streams)."""
    out, seen = [], set()
    for segment in segments:
        for g in getattr(segment, "generators", ()):
            if id(g) not in seen:
                seen.add(id(g))
                out.append(g)
    return out


def replay_generators_context(segment):
    """A ``context_fn`` (to call now, before the forward) that replays ``segment.generators`` in the recompute."""
    generators = _generators_of([segment])
    states = [g.get_state() for g in generators]

    def context_fn():
        return contextlib.nullcontext(), _ReplayGenerators(generators, states)

    return context_fn


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


def compose_contexts(*context_fns):
    """One ``context_fn`` from several, each returning a (forward, recompute) pair of context managers."""

    def context_fn():
        pairs = [f() for f in context_fns]
        return _All([p[0] for p in pairs]), _All([p[1] for p in pairs])

    return context_fn


def checkpoint_context(*segments, context_fns=()):
    """The ``context_fn`` for one ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` call running
    ``segments``: the recompute marked (``recompute_aware_context``), every generator the segments show
    replayed, then ``context_fns`` of the caller's own. Call it just before the checkpoint call (it takes
    the generators' states now)."""
    fns = [recompute_aware_context]
    generators = _generators_of(segments)
    if generators:
        states = [g.get_state() for g in generators]
        fns.append(lambda: (contextlib.nullcontext(), _ReplayGenerators(generators, states)))
    return compose_contexts(*fns, *context_fns)


class Segment(torch.nn.Module):
    """One checkpointed segment of a ckverify Case, as a module (see the package docstring)."""

    def __init__(self, fn, params, index, step, micro, generators=()):
        super().__init__()
        self._ckv_fn = fn
        # The Case's own parameter tensors, registered as they are: a wrapper that looks at
        # parameters() sees (and may change requires_grad of) exactly what the Case trains.
        for i, p in enumerate(params):
            self._parameters["p%d" % i] = p
        self.index, self.step, self.micro = index, step, micro
        self.generators = list(generators)

    def forward(self, *args, **kwargs):
        if kwargs:
            raise TypeError("the segment takes positional arguments only; it was called with keyword argument(s) %s "
                            "(an --impl option the callable passed on to the segment?)" % ", ".join(sorted(kwargs)))
        return self._ckv_fn(*args)

    def extra_repr(self):
        return "index=%d, step=%d, micro=%d" % (self.index, self.step, self.micro)


class Blocks(torch.nn.ModuleList):
    """The Case's block stack, as a strategy holds it (see the package docstring)."""
