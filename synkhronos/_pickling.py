"""Function cores travel to the workers pickled: compiled functions are linked
again there (``_load_function``), shared variables the workers already hold go
as references into their list, and ``OpFromGraph`` Ops go without the gradient
caches that pickle cannot copy."""

import copyreg
import io
import pickle

from ._warnings import compiler_warnings_hidden

__all__ = ["dumps_cores", "loads_cores", "unpicklable_error"]


def dumps_cores(obj, known=()):
    """``pickle.dumps`` of function cores, whose compiled functions load with
    ``_load_function``.

    ``known`` are the shared variables the workers already hold, by index: a
    new function that uses one must use the worker's variable, not a copy, so
    each is pickled as a reference (its variable, container and value cell) that
    ``loads_cores`` resolves against the worker's list."""
    buf = io.BytesIO()
    _KnownPickler(buf, known).dump(obj)
    return buf.getvalue()


def unpicklable_error(functions, shareds, known, exc):
    """A TypeError that names the first of ``functions`` (or shared variable)
    that ``dumps_cores`` cannot pickle, and says why; ``exc`` is pickle's error."""
    what = [(f._what, f._core) for f in functions] + [("shared variable %r" % (v,), v) for v in shareds]
    culprit = "the functions"
    for label, obj in what:
        try:
            dumps_cores(obj, known)
        except Exception:
            culprit = label
            break
    return TypeError(
        "distribute(): %s cannot be sent to the workers, because pickle cannot copy part of its graph "
        "(%s: %s). Every Op in a distributed graph must pickle: an Op that holds a lambda or a "
        "function defined inside another function does not; define it at module level"
        % (culprit, type(exc).__name__, exc))


def loads_cores(blob, known):
    """What ``dumps_cores`` pickled, with references into ``known`` (the
    worker's shared variables) resolved."""
    return _KnownUnpickler(io.BytesIO(blob), known).load()


_PARTS = ("var", "container", "cell")


def _parts(var):
    return var, var.container, var.container.storage


class _KnownPickler(pickle.Pickler):
    def __init__(self, buf, known):
        from pytensor.compile import Function
        from pytensor.compile.builders import OpFromGraph

        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self._refs = {id(obj): (part, i) for i, var in enumerate(known)
                      for part, obj in zip(_PARTS, _parts(var))}
        self._function, self._op_from_graph = Function, OpFromGraph

    def persistent_id(self, obj):
        return self._refs.get(id(obj)) if self._refs else None

    def reducer_override(self, obj):
        if type(obj) is self._function:
            return _reduce_function(obj)
        if isinstance(obj, self._op_from_graph):
            return _reduce_op_from_graph(obj)
        return NotImplemented


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
