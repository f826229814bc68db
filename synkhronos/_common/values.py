"""The checks on values that ``Data`` and the public calls share: flags, the
dtypes Data may hold, values turned into arrays with errors that name the
argument, and the one rule for whether a value fits a dtype (docs: "Which
values fit")."""

import numbers
import warnings

import numpy as np

from .brief import brief

__all__ = ["check_flag", "check_oversize", "check_dtype", "as_array", "array_fits", "fit_to",
           "described"]


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


def array_fits(source, target):
    """Whether an array (numpy or Data) of dtype ``source`` fits ``target``
    (dtypes or their names): the same dtype, or one numpy casts to it safely
    (int16 into float32; not int64 or float64 into float32)."""
    return source == target or np.can_cast(source, target, "safe")


def fit_to(value, arr, dtype):
    """``arr`` (``np.asarray(value)``) as an array of ``dtype`` if ``value``
    fits it, else None.

    An array fits by ``array_fits``.  Python numbers and lists of them (and
    numpy scalars) fit when every number keeps its value: nothing wraps (300
    into int8), no fraction is dropped (2.5 into an integer dtype), nothing
    overflows to inf; a float into a float dtype rounds to its nearest value
    there, as a literal in that dtype would (a list with any float in it is
    floats; one of ints only must be exact)."""
    dtype = np.dtype(dtype)
    if arr.dtype == dtype and (isinstance(value, np.ndarray) or dtype.kind not in "fc"):
        return arr  # (numpy reads ints past int64 beside negative ones as floats: checked below)
    if arr.dtype.kind not in "biufc" or dtype.kind not in "biufc":
        return None
    if isinstance(value, np.ndarray):
        return arr.astype(dtype) if array_fits(arr.dtype, dtype) else None
    numbers = np.asarray(value, dtype=object)  # as given: ``arr`` may have made big ints float64
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # overflow to inf: judged below
        try:
            out = np.asarray(value, dtype=dtype)
        except (OverflowError, TypeError, ValueError):  # 300 into int8, NaN or complex into int
            return None
        if dtype.kind in "fc" and any(isinstance(x, (float, complex, np.inexact)) for x in numbers.flat):
            kept = ~(np.isinf(out) & np.isfinite(arr))  # floats round; only overflow loses
        else:  # each number compared as a Python number, exactly
            kept = out.astype(object) == numbers
    return out if bool(np.all(kept)) else None


def described(value, arr):
    """How an error names a value that does not fit: an array by its dtype,
    numbers by themselves."""
    return "%s data" % arr.dtype if isinstance(value, np.ndarray) else "the numbers %s" % brief(value)
