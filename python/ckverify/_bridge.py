"""The Python bridge's loader (called by verifier/impls/python_impl.cpp): turns a ``py:`` spec into a runner.

A spec is ``py:MODULE:CALLABLE[:key=value,...]``. Keys that start with ``@`` are ckverify's, the others
are keyword options for CALLABLE. Values are typed: ``true``/``false``, ``none``, integers, floats, JSON
(``[...]``, ``{...}``, ``"..."``: lists, dicts and strings that contain commas), else strings.

Calling conventions (``@convention=``):

``function`` (default)
    ``CALLABLE(segment, *ARGS, *segment_args, **options)``, returning what ``segment`` returned:
    ``torch.utils.checkpoint.checkpoint``, ``deepspeed.checkpointing.checkpoint``. ``@args=[...]`` gives
    positional arguments that come between the function and the segment's own (megatron-core's
    ``tensor_parallel.checkpoint(function, distribute_saved_activations, *args)``: ``@args=[false]``).
``wrapper``
    ``CALLABLE(module, **options)`` returns a module (torch.distributed's and fairscale's
    ``checkpoint_wrapper``), called as ``wrapped(*segment_args)``. ckverify wraps each segment once (one
    wrapper per segment and micro-batch, for the life of a training run), as a model is wrapped once.

``strategy`` (``ckverify check --strategy SPEC`` adds it)
    ``CALLABLE(blocks, x, **options)`` returns the block stack's output: the strategy decides which blocks
    to checkpoint, with any checkpoint function (seed 001's ``run_with_*_checkpointing``,
    ``torch.utils.checkpoint.checkpoint_sequential``). ``blocks`` is a ``ckverify.Blocks`` (an
    ``nn.ModuleList`` of ``ckverify.Segment``, one per block).

``segment`` is a ``ckverify.Segment`` (a module holding the segment's parameters, its index, the step
and the micro-batch). A spec whose callable cannot take its convention's arguments is refused before
any Case runs (the CLI's exit 2): a positional parameter that would silently take the hidden state (a
flag such as ``distribute_saved_activations``) is refused with the ``@args`` that fills it.
"""
import importlib
import inspect
import json

import torch

from ckverify import Blocks, Segment

CONVENTIONS = ("function", "wrapper", "strategy")


class SpecError(ValueError):
    """A spec that cannot work; its message is the CLI's one-line error."""


def typed(value):
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    if value in ("none", "None"):
        return None
    if value[:1] in ("[", "{", '"'):
        try:
            return json.loads(value)
        except ValueError as e:
            raise SpecError("option value %s is not valid JSON: %s" % (value[:80], e)) from None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _resolve(module, callable_name):
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # an import that fails for any reason is the spec's problem, named as such
        raise SpecError("cannot import Python module %s: %s: %s" % (module, type(e).__name__, str(e).split("\n")[0]))
    for part in callable_name.split("."):
        if not hasattr(obj, part):
            raise SpecError("Python module %s has no %s" % (module, callable_name))
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError("Python %s.%s is not callable" % (module, callable_name))
    return obj


def _signature(target):
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None  # a builtin or extension callable without a signature: nothing to check up front


def _check_function(name, target, positional, options):
    sig = _signature(target)
    if sig is None:
        return
    params = list(sig.parameters.values())
    P = inspect.Parameter
    named_positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    has_var_positional = any(p.kind == P.VAR_POSITIONAL for p in params)
    has_var_keyword = any(p.kind == P.VAR_KEYWORD for p in params)
    if not named_positional and not has_var_positional:
        raise SpecError("%s%s takes no positional argument: it cannot be called as %s(function, *args)" % (name, sig, name))
    for k in options:
        p = sig.parameters.get(k)
        if (p is None or p.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL)) and not has_var_keyword:
            raise SpecError("%s%s has no keyword parameter %s" % (name, sig, k))
    # After the function and @args, a named positional parameter would take the segment's first
    # argument (the hidden state). Where the callable also takes *args, that is a misbinding: the
    # hidden state would land in a flag. Without *args the parameter is the segment's input.
    rest = named_positional[1 + len(positional):]
    if has_var_positional:
        # Given as keyword options they would collide with the segment's arguments ("multiple values").
        missing = [p.name for p in rest]
        if missing:
            raise SpecError(
                "%s%s: its positional parameter(s) %s would take the segment's hidden state; give them with "
                "@args=[...] (e.g. @args=[false]), not as keyword options" % (name, sig, ", ".join(missing)))
    elif len(positional) + 1 > len(named_positional):
        raise SpecError("%s%s takes %d positional argument(s); @args gives %d after the function" %
                        (name, sig, len(named_positional), len(positional)))


def _check_strategy(name, target, options):
    sig = _signature(target)
    if sig is None:
        return
    try:
        sig.bind(Blocks(), object(), **options)
    except TypeError as e:
        raise SpecError("%s%s cannot be called as %s(blocks, x, **options): %s" % (name, sig, name, e)) from None


def _check_wrapper(name, target, options):
    sig = _signature(target)
    if sig is None:
        return
    try:
        sig.bind(object(), **options)
    except TypeError as e:
        raise SpecError("%s%s cannot be called as %s(module, **options): %s" % (name, sig, name, e)) from None


class _FunctionRunner:
    def __init__(self, target, positional, options):
        self.target, self.positional, self.options = target, tuple(positional), options

    def __call__(self, fn, params, index, step, micro, args, generators):
        segment = Segment(fn, params, index, step, micro, generators)
        return self.target(segment, *self.positional, *args, **self.options)


class _WrapperRunner:
    def __init__(self, target, options):
        self.target, self.options = target, options
        self.wrapped = {}  # (index, micro) -> (segment, wrapped), for one training run at a time

    def __call__(self, fn, params, index, step, micro, args, generators):
        run_key = tuple(p._cdata for p in params)  # the parameters of the training run
        entry = self.wrapped.get((index, micro))
        if entry is None or entry[0] != run_key:
            if entry is not None:
                # Another training run (ckverify runs one at a time): its wrappers replace the last one's.
                self.wrapped = {k: v for k, v in self.wrapped.items() if v[0] == run_key}
            segment = Segment(fn, params, index, step, micro, generators)
            entry = (run_key, segment, self.target(segment, **self.options))
            self.wrapped[(index, micro)] = entry
        _, segment, wrapped = entry
        # The same module, now running this call's segment (a recompute of this step and micro-batch
        # happens before the next forward of the same key).
        segment._ckv_fn, segment.step, segment.micro = fn, step, micro
        segment.generators = list(generators)
        return wrapped(*args)


class _StrategyRunner:
    is_strategy = True

    def __init__(self, target, options):
        self.target, self.options = target, options

    def __call__(self, fns, params, step, micro, x, generators):
        blocks = Blocks(Segment(fn, p, i, step, micro, g) for i, (fn, p, g) in enumerate(zip(fns, params, generators)))
        out = self.target(blocks, x, **self.options)
        if not isinstance(out, torch.Tensor):
            raise TypeError("the strategy returned %s, not the block stack's output tensor" % type(out).__name__)
        return out


def load(module, callable_name, options):
    """The runner for one spec: runner(fn, params, index, step, micro, args, generators) -> what the callable
    returned (a strategy's: runner(fns, params, step, micro, x, generators), one list per block)."""
    ours = {k: v for k, v in options.items() if k.startswith("@")}
    theirs = {k: typed(v) for k, v in options.items() if not k.startswith("@")}
    unknown = sorted(set(ours) - {"@convention", "@args"})
    if unknown:
        raise SpecError("unknown ckverify option(s) %s (known: @convention, @args)" % ", ".join(unknown))
    positional = typed(ours["@args"]) if "@args" in ours else []
    if not isinstance(positional, list):
        raise SpecError("@args must be a JSON list, e.g. @args=[false]")
    target = _resolve(module, callable_name)
    # An adapter names its own convention (ckverify.adapters.transformers is a wrapper); @convention wins.
    convention = ours.get("@convention", getattr(target, "ckverify_convention", "function"))
    if convention not in CONVENTIONS:
        raise SpecError("@convention=%s: expected one of %s" % (convention, ", ".join(CONVENTIONS)))
    name = "%s.%s" % (module, callable_name)
    validate = getattr(target, "ckverify_validate", None)
    if callable(validate):
        try:
            validate(**theirs)
        except (TypeError, ValueError, ImportError) as e:
            raise SpecError("%s: %s" % (name, e)) from None
    if convention == "function":
        _check_function(name, target, positional, theirs)
        return _FunctionRunner(target, positional, theirs)
    if positional:
        raise SpecError("@args applies to @convention=function only")
    if convention == "strategy":
        _check_strategy(name, target, theirs)
        return _StrategyRunner(target, theirs)
    _check_wrapper(name, target, theirs)
    return _WrapperRunner(target, theirs)
