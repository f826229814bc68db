"""The checks on values that ``Data`` and the public calls share: flags, the
dtypes Data may hold, and values turned into arrays with errors that name the
argument."""

import numbers

import numpy as np

from ._plan import brief

__all__ = ["check_flag", "check_oversize", "check_dtype", "as_array"]


def check_oversize(oversize):
    if isinstance(oversize, bool) or not isinstance(oversize, numbers.Real) or not 1 <= oversize <= 2:
        raise ValueError("oversize must be a number in [1, 2], got %r" % (oversize,))
    return float(oversize)


def check_flag(value, argname):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError("%s must be True or False, got %r" % (argname, value))
    return bool(value)


def check_dtype(dtype, argname="dtype"):
    """Data holds numbers and booleans: an object or string array in shared
    memory would hold pointers into the master's own memory."""
    if dtype.kind not in "biufc":
        raise TypeError("%s: dtype %s cannot be Data; use a boolean, integer, float or complex dtype"
                        % (argname, dtype))
    return dtype


def as_array(value, argname):
    """``np.asarray(value)``, with an error that names ``argname``."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError("%s is not an array of numbers (%s): %s" % (argname, exc, brief(value))) from None
