"""The arguments of ``synk.function()``, checked and put in one form."""

from .._common.reduce import check_op

__all__ = ["is_variable", "is_shared", "as_var_list", "parse_outputs", "parse_updates", "parse_givens",
           "check_sliceable", "check_inputs"]


def is_variable(v):
    from pytensor.graph.basic import Variable

    return isinstance(v, Variable)


def is_shared(v):
    from pytensor.compile.sharedvalue import SharedVariable

    return isinstance(v, SharedVariable)


def as_var_list(value, argname):
    if value is None:
        return []
    if is_variable(value):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(is_variable(v) for v in value):
        raise TypeError("%s must be a list of PyTensor variables, got %r" % (argname, value))
    return list(value)


def parse_outputs(outputs):
    """Returns (variables, modes, single) from the ``outputs`` argument."""
    if outputs is None:
        return [], [], False
    if is_variable(outputs):
        return [outputs], ["avg"], True
    if isinstance(outputs, tuple) and len(outputs) == 2 and is_variable(outputs[0]) \
            and not is_variable(outputs[1]):
        return [outputs[0]], [check_op(outputs[1], "output reduce operation")], True
    if not isinstance(outputs, (list, tuple)):
        raise TypeError("outputs must be a variable, a (variable, op) pair or a list of "
                        "those, got %r" % (outputs,))
    variables, modes = [], []
    for o in outputs:
        if is_variable(o):
            variables.append(o)
            modes.append("avg")
        elif isinstance(o, tuple) and len(o) == 2 and is_variable(o[0]):
            variables.append(o[0])
            modes.append(check_op(o[1], "output reduce operation"))
        else:
            raise TypeError("each output must be a variable or a (variable, op) pair, got %r" % (o,))
    return variables, modes, False


def parse_updates(updates):
    if updates is None:
        return [], []
    if isinstance(updates, dict):
        updates = list(updates.items())
    if not isinstance(updates, (list, tuple)):
        raise TypeError("updates must be a list of (shared, update) pairs or (shared, update, op) "
                        "triples, got %r" % (updates,))
    pairs, modes = [], []
    for u in updates:
        if not isinstance(u, (list, tuple)) or len(u) not in (2, 3):
            raise TypeError("each update must be a (shared, update) pair or a (shared, update, op) "
                            "triple, got %r" % (u,))
        if not is_shared(u[0]):
            raise TypeError("update target must be a shared variable, got %r" % (u[0],))
        pairs.append((u[0], u[1]))
        modes.append(check_op(u[2], "update reduce operation", allow_none=False) if len(u) == 3 else "avg")
    return pairs, modes


def parse_givens(givens):
    if givens is None:
        return []
    if isinstance(givens, dict):
        return list(givens.items())
    pairs = isinstance(givens, (list, tuple)) and all(isinstance(g, (list, tuple)) and len(g) == 2
                                                      for g in givens)
    if pairs:
        return [tuple(g) for g in givens]
    raise TypeError("givens must be a dict or a list of (variable, replacement) pairs, got %r" % (givens,))


def check_sliceable(sliceable, graph):
    """Raise unless every sliceable shared variable is a shared variable of
    ndim > 0 that ``graph`` (a list of variables) uses."""
    from pytensor.graph.traversal import ancestors

    if not all(is_shared(s) for s in sliceable):
        raise TypeError("sliceable_shareds must be shared variables, got %r" % (sliceable,))
    used = set(ancestors(graph)) if graph else set()
    for s in sliceable:
        if s not in used:
            raise ValueError("sliceable shared variable %r is not used in the function" % (s,))
        if s.ndim == 0:
            raise TypeError("sliceable shared variable %r is 0-d and cannot be sliced" % (s,))


def check_inputs(scat, bcast):
    """Raise for an input named twice, or a scattered input that cannot be split
    by rows (0-d, or of a fixed row count)."""
    seen = set()
    for v in scat + bcast:
        if v in seen:
            raise ValueError("inputs and bcast_inputs name the variable %s twice" % (v,))
        seen.add(v)
    for v in scat:
        if getattr(v, "ndim", 1) == 0:
            raise TypeError("scattered input %r is 0-d and cannot be split along axis 0; "
                            "pass it in bcast_inputs" % (v,))
        fixed = (getattr(v.type, "shape", None) or (None,))[0]
        if fixed is not None:
            raise ValueError(
                "scattered input %r has a fixed number of rows (shape=%s), but each rank gets its "
                "own share of the rows; build it with shape=(None, ...) (e.g. pt.tensor(%r, shape=%s)), "
                "or pass it in bcast_inputs"
                % (v, v.type.shape, v.name or "x", (None,) + tuple(v.type.shape[1:])))
