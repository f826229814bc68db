"""Function cores travel to the workers pickled: compiled functions are linked
again there (``_load_function``), shared variables the workers already hold go
as references into their list, and ``OpFromGraph`` Ops go without the gradient
caches that pickle cannot copy.  What the standard pickler cannot copy (the
closures PyTensor itself keeps, as in ``Blockwise``) goes by cloudpickle; a
function that neither can copy is refused alone (``sendable``), and the error
names its Op."""

import copyreg
import functools
import io
import pickle

from .._common.compiler_warnings import compiler_warnings_hidden

__all__ = ["dumps_cores", "loads_cores", "sendable", "unpicklable_error"]


def dumps_cores(obj, known=()):
    """``pickle.dumps`` of function cores, whose compiled functions load with
    ``_load_function``; by cloudpickle where the standard pickler fails.

    ``known`` are the shared variables the workers already hold, by index: a
    new function that uses one must use the worker's variable, not a copy, so
    each is pickled as a reference (its variable, container and value cell) that
    ``loads_cores`` resolves against the worker's list."""
    try:
        return _dumps(_KnownPickler, obj, known)
    except Exception:  # pickle raises TypeError, AttributeError, PicklingError, ...
        pass
    return _dumps(_cloud_pickler(), obj, known)


def _dumps(pickler, obj, known):
    buf = io.BytesIO()
    pickler(buf, known).dump(obj)
    return buf.getvalue()


def sendable(functions, known):
    """``(cores, refused)``: the cores of ``functions``, None in place of each
    that cannot be pickled, and for those the TypeError their calls raise (by
    function index).  Each core is tried alone, with ``known`` as references."""
    cores, refused = [], {}
    for f in functions:
        try:
            dumps_cores(f._core, known)
        except Exception as exc:
            refused[f._core.ID] = unpicklable_error(f, exc)
            cores.append(None)
        else:
            cores.append(f._core)
    return cores, refused


def unpicklable_error(function, exc):
    """The TypeError for ``function``, which ``dumps_cores`` cannot pickle
    (``exc``): it names the first Op of its graph that cannot be pickled, and
    that Op's module."""
    op = _unpicklable_op(function._core)
    part = "part of its graph" if op is None else "its Op %s (class %s of module %s)" % (
        op, type(op).__qualname__, type(op).__module__)
    error = TypeError(
        "distribute(): %s cannot be sent to the workers: neither pickle nor cloudpickle can copy %s "
        "(%s: %s). Every Op in a distributed graph must pickle; the session's other functions were "
        "distributed, and this one raises this error when called"
        % (function._what, part, type(exc).__name__, exc))
    error.__cause__ = exc
    return error


def _unpicklable_op(core):
    seen = set()
    for fn in core.compiled_variants().values():
        for node in fn.maker.fgraph.toposort():
            if id(node.op) in seen:
                continue
            seen.add(id(node.op))
            try:
                dumps_cores(node.op)
            except Exception:
                return node.op
    return None


def loads_cores(blob, known):
    """What ``dumps_cores`` pickled, with references into ``known`` (the
    worker's shared variables) resolved."""
    return _KnownUnpickler(io.BytesIO(blob), known).load()


_PARTS = ("var", "container", "cell")


def _parts(var):
    return var, var.container, var.container.storage


def _references(known):
    return {id(obj): (part, i) for i, var in enumerate(known) for part, obj in zip(_PARTS, _parts(var))}


def _reduced(obj):
    """How a compiled function or an ``OpFromGraph`` travels; NotImplemented for
    anything else (the pickler's own way)."""
    from pytensor.compile import Function
    from pytensor.compile.builders import OpFromGraph

    if type(obj) is Function:
        return _reduce_function(obj)
    if isinstance(obj, OpFromGraph):
        return _reduce_op_from_graph(obj)
    return NotImplemented


class _Known:
    """What both picklers share: ``known`` shared variables go as references."""

    def __init__(self, buf, known):
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self._refs = _references(known)

    def persistent_id(self, obj):
        return self._refs.get(id(obj)) if self._refs else None


class _KnownPickler(_Known, pickle.Pickler):
    def reducer_override(self, obj):
        return _reduced(obj)


@functools.cache
def _cloud_pickler():
    """``_KnownPickler`` on cloudpickle's pickler, which copies local functions
    and closures by value (made once, when first needed)."""
    import cloudpickle

    class _KnownCloudPickler(_Known, cloudpickle.Pickler):
        def reducer_override(self, obj):
            reduced = _reduced(obj)
            return super().reducer_override(obj) if reduced is NotImplemented else reduced

    return _KnownCloudPickler


def _reduce_op_from_graph(op):
    """An ``OpFromGraph`` (and subclasses, e.g. model libraries' layers) without
    its gradient caches: once a gradient was taken they hold closures, which
    pickle cannot copy.  PyTensor rebuilds them when asked; a worker only runs
    the compiled function and never asks."""
    state = dict(vars(op))
    state["_lop_op_cache"] = {}
    state["_rop_op_cache"] = None
    return _restore_op, (type(op), state)


def _restore_op(cls, state):
    op = cls.__new__(cls)
    op.__dict__.update(state)
    return op


class _KnownUnpickler(pickle.Unpickler):
    def __init__(self, file, known):
        super().__init__(file)
        self._known = known

    def persistent_load(self, pid):
        part, i = pid
        return _parts(self._known[i])[_PARTS.index(part)]


def _reduce_function(fn):
    _, args = copyreg.dispatch_table[type(fn)](fn)
    return _load_function, args


def _load_function(maker, input_storage, inputs_data, trust_input=False):
    """Link a pickled PyTensor function again, as PyTensor's own loader does, but
    without its check that every input still holds the pickled value: the JAX
    backend replaces a generator input by a fresh copy in JAX's form (a dict of
    arrays), and comparing dicts of arrays raises.  (See ``compile_function``
    for the backend's warning about that copy.)"""
    del inputs_data
    _restore_history(maker.fgraph)
    with compiler_warnings_hidden(maker.linker):
        fn = maker.create(input_storage)
    fn.trust_input = trust_input
    return fn


def _restore_history(fgraph):
    """PyTensor 2.38 pickles a graph without its callbacks' timings and its
    ``History`` features (``ReplaceValidate``) without their record, and does
    not make them again when loading, so a linker that changes the loaded graph
    (JAX's, replacing random generators) fails: give them empty ones, as a new
    graph has."""
    from collections import defaultdict

    from pytensor.graph.features import History

    if not hasattr(fgraph, "execute_callbacks_times"):
        fgraph.execute_callbacks_times = defaultdict(float)
    for feature in getattr(fgraph, "_features", ()):
        if isinstance(feature, History) and not hasattr(feature, "history"):
            feature.history = {fgraph: []}
