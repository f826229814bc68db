"""Whether values fit shared variables: the targets of a collective, and each
value checked and converted by the package's one rule (``_common.values.fit_to``; docs:
"Which values fit")."""

import numpy as np

from .._common.brief import brief
from .._common.values import array_fits, as_array, fit_to
from .._data import Data

__all__ = ["targets", "as_given", "values_for", "check_static", "array_of"]


def targets(rt, shared_vars):
    """(variables, ids, single) for a ``shared_vars`` argument."""
    from pytensor.compile.sharedvalue import SharedVariable

    single = isinstance(shared_vars, SharedVariable)
    variables = [shared_vars] if single else shared_vars
    if not isinstance(variables, (list, tuple)) or not variables or \
            not all(isinstance(v, SharedVariable) for v in variables):
        raise TypeError("shared_vars must be a shared variable or a non-empty list of them, got %r"
                        % (shared_vars,))
    ids = []
    for v in variables:
        i = rt.registry.shared_id(v)
        if i is None:
            raise ValueError("shared variable %r is not used in any Synkhronos function, so the "
                             "workers do not have it" % (v,))
        if i >= rt.registry.n_distributed_shareds:
            raise RuntimeError("shared variable %r belongs to a function built since the last "
                               "synkhronos.distribute(): call distribute() again first" % (v,))
        ids.append(i)
    return list(variables), ids, single


def as_given(items, single):
    """The results as the targets were given: one for one variable
    (``single``), a tuple for a list."""
    return items[0] if single else tuple(items)


def values_for(values, variables, single, argname="values"):
    """One value per variable, as numpy arrays of the variable's dtype, or Data
    (of a dtype that fits it).

    For a list of variables (``single`` False) ``values`` is a list or tuple with
    one value for each.  For one variable it is that variable's value; a list
    holding one Data or array of the variable's ndim is taken as a list of one
    value (``set_value(0, s, [v])``)."""
    if single:
        first = values[0] if isinstance(values, (list, tuple)) and len(values) == 1 else None
        ndim = variables[0].ndim
        listed = isinstance(first, Data) or (isinstance(first, np.ndarray) and first.ndim == ndim)
        values = [first] if listed else [values]
    if not isinstance(values, (list, tuple)) or len(values) != len(variables):
        raise ValueError("%s must give one value for each of the %d shared variables, got %r"
                         % (argname, len(variables), values))
    out = []
    for k, (v, var) in enumerate(zip(values, variables)):
        where = argname if len(values) == 1 else "%s[%d]" % (argname, k)  # which value is wrong
        if isinstance(v, Data):
            if not array_fits(v.dtype, var.dtype) or v.ndim != var.ndim:
                raise TypeError("%s: %r (dtype %s, ndim %d) does not fit shared variable %s (dtype %s, "
                                "ndim %d)" % (where, v, v.dtype, v.ndim, var, var.dtype, var.ndim))
            if v._array is None:
                raise ValueError("%s: Data %r holds no memory" % (where, v))
            out.append(v)  # of another dtype too: each rank's device.set_value converts its rows
            continue
        # A static shape is checked on the rows each rank gets (``check_static``).
        given = as_array(v, where)
        arr = fit_to(v, given, var.dtype)
        if arr is None:
            raise TypeError("%s: %s (dtype %s) does not fit shared variable %s (dtype %s) without loss"
                            % (where, brief(v), given.dtype, var, var.dtype))
        if arr.ndim != var.ndim:
            raise TypeError("%s: value of ndim %d does not fit shared variable %s (ndim %d)"
                            % (where, arr.ndim, var, var.ndim))
        out.append(arr)
    return out


def check_static(var, shape, argname="values"):
    """Raise TypeError (before any rank changes) if a value of ``shape`` does not
    fit the static shape of ``var``'s type (``pytensor.shared(..., shape=...)``)."""
    static = getattr(var.type, "shape", None) or ()
    if any(d is not None and d != n for d, n in zip(static, shape)):
        raise TypeError("%s: a value of shape %s does not fit %s, whose shape is fixed to %s"
                        % (argname, tuple(shape), var, tuple("?" if d is None else d for d in static)))


def array_of(value):
    """The array of a value: a Data's own, or the value."""
    return value._array if isinstance(value, Data) else value
