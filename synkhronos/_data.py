"""``synk.Data``: numpy arrays in POSIX shared memory that every rank can read."""

import numbers

import numpy as np

from ._common.brief import brief
from ._common.values import as_array as _as_array
from ._common.values import check_dtype as _check_dtype
from ._common.values import check_flag as _check_flag
from ._common.values import check_oversize as _check_oversize
from ._common.values import described as _described
from ._common.values import fit_to as _fit_to
from ._session import runtime
from ._wire.protocol import DropData, MapData
from ._wire.shared_memory import DataMemory

__all__ = ["Data", "data"]


class Data:
    """Input data for Synkhronos functions, held in OS shared memory.

    Create with ``synkhronos.data()``.  Behaves like a numpy array for reading and
    writing (``d[2:4]``, ``d[3] = 0``, ``len(d)``); ``dtype`` and ``ndim`` are fixed
    like a PyTensor variable's, while the shape may change.  Memory is allocated
    in an OS shared-memory segment that all worker processes map; a reallocation
    (a larger value, ``set_shape``, ``free_memory``) reaches them at once.

    Parameters
    ----------
    ID : int
        Identifier within the Synkhronos session.
    dtype : str or numpy dtype
    ndim : int
    minibatch : bool, optional
        When a function call selects rows with ``batch=``, a minibatch input is
        indexed by position within the selection (its row k is the k-th selected
        row) instead of by the selected indices.
    name : str, optional
    """

    def __init__(self, ID, dtype, ndim, minibatch=False, name=None):
        self._rt = runtime.require()
        self._ID = ID
        self._dtype = np.dtype(dtype)
        self._dtype_name = self._dtype.name
        self._ndim = int(ndim)
        self._minibatch = bool(minibatch)
        self._name = name
        self._memory = DataMemory(self._rt.token, "d%d" % ID, self._dtype, device=self._rt.device)

    @property
    def _array(self):
        """The array (None before allocation), without counting a hand-out."""
        return self._memory.array

    # ---------------------------------------------------------------- properties
    @property
    def data(self):
        """The underlying numpy array (a view of the shared memory), or None
        before any memory is allocated.  Read and write it in place; change its
        shape only through ``set_value``/``set_shape``/``set_length``."""
        self._memory.version += 1
        return self._memory.array

    @property
    def dtype(self):
        """Data type, as a string (``'float32'``), like a PyTensor variable's."""
        return self._dtype_name

    @property
    def ndim(self):
        """Number of dimensions (fixed)."""
        return self._ndim

    @property
    def shape(self):
        """Shape of the underlying array (None before allocation)."""
        return None if self._array is None else self._array.shape

    @property
    def size(self):
        """Number of items in the underlying array."""
        return 0 if self._array is None else self._array.size

    @property
    def alloc_size(self):
        """Number of items the shared-memory allocation can hold (at least
        ``size``; larger after an ``oversize`` or a shrink)."""
        return self._memory.capacity

    @property
    def minibatch(self):
        """Whether this is minibatch data (see class docstring)."""
        return self._minibatch

    @property
    def name(self):
        """Name, possibly None."""
        return self._name

    # ------------------------------------------------------------ numpy behaviour
    def _require_array(self):
        if self._rt.closed:
            raise RuntimeError("Data %r belongs to a closed Synkhronos session; its memory is "
                               "released" % self)
        if self._array is None:
            raise ValueError("Data %r holds no memory yet: call set_value() or set_shape() first" % self)
        return self._array

    def __getitem__(self, k):
        self._memory.version += 1  # a view, which may be written
        return self._require_array()[k]

    def __setitem__(self, k, v):
        self._rt.check_owner()  # the memory is the session's: a forked child must not change it
        self._memory.version += 1
        self._require_array()[k] = v

    def __len__(self):
        if not self._rt.closed:
            arr = self._memory.array
            return 0 if arr is None else len(arr)
        return len(self._require_array())  # raises: the session is closed

    def __array__(self, dtype=None, copy=None):
        self._memory.version += 1
        arr = self._require_array()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __reduce__(self):
        raise TypeError(
            "%r cannot be pickled: it is a handle on its session's shared memory, which only the "
            "process that called synkhronos.fork() drives. Send its values instead (d.data is a "
            "numpy array)" % self)

    def __repr__(self):
        return "<synkhronos.Data %s dtype=%s shape=%s%s>" % (
            self._label(), self.dtype, self.shape,
            " minibatch" if self._minibatch else "")

    # -------------------------------------------------------------------- values
    def condition_data(self, input_data, force_cast=False):
        """The numpy array that ``set_value(input_data)`` would store.

        Parameters
        ----------
        input_data : array_like
        force_cast : bool, optional
            Convert to this object's dtype whatever the input's dtype.

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        TypeError
            If the dimensions differ, or the dtype would lose information and
            ``force_cast`` is False.
        """
        return self._condition(input_data, force_cast, "Data.condition_data(input_data)")

    def _condition(self, input_data, force_cast, argname):
        force_cast = _check_flag(force_cast, "force_cast")
        if isinstance(input_data, Data):
            input_data = input_data._require_array()
        arr = _as_array(input_data, argname)
        if arr.dtype != self._dtype:
            if arr.dtype.kind not in "biufc":
                raise TypeError("%s: cannot store %s, of dtype %s, in Data %s of dtype %s: it is not "
                                "numbers" % (argname, brief(input_data), arr.dtype, self._label(),
                                             self.dtype))
            fitted = arr.astype(self._dtype) if force_cast else _fit_to(input_data, arr, self._dtype)
            if fitted is None:
                raise TypeError(
                    "%s: cannot store %s in Data %s of dtype %s without loss; pass force_cast=True "
                    "to convert anyway" % (argname, _described(input_data, arr), self._label(), self.dtype))
            arr = fitted
        if arr.ndim != self._ndim:
            raise TypeError("%s: Data %s has ndim=%d, got a value with ndim=%d (shape %s)"
                            % (argname, self._label(), self._ndim, arr.ndim, arr.shape))
        return arr

    def _label(self):
        """How messages name this object: its name, or its number in the session."""
        return repr(self._name) if self._name else "#%d" % self._ID

    @runtime.action("Data.set_value()")
    def set_value(self, input_data, force_cast=False, oversize=1):
        """(Over)write the values; change the shape and reallocate if needed.

        Parameters
        ----------
        input_data : array_like
            New values; the array keeps exactly their shape.
        force_cast : bool, optional
            Convert to this object's dtype without error.
        oversize : float in [1, 2], optional
            When reallocating, allocate this factor more than needed.

        Raises
        ------
        TypeError
            See ``condition_data``.
        ValueError
            If ``oversize`` is outside [1, 2].
        OSError
            Where ``/dev/shm`` has no room: the old values are kept.
        """
        self._set_value(input_data, force_cast, oversize, "Data.set_value(input_data)")

    def _set_value(self, input_data, force_cast, oversize, argname):
        oversize = _check_oversize(oversize)
        arr = self._condition(input_data, force_cast, argname)
        self._reshape(arr.shape, oversize, keep=False)
        self._array[...] = arr

    @runtime.action("Data.set_length()")
    def set_length(self, length, oversize=1):
        """Change the length (axis 0), keeping the other dimensions.

        Rows that fit in both the old and the new length keep their values; new
        rows are uninitialised.  Reallocates only if the allocation is too small.
        """
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 0:
            raise ValueError("length must be a non-negative int, got %r" % (length,))
        if self._ndim == 0:
            raise TypeError("a 0-d Data has no length")
        tail = self.shape[1:] if self._array is not None else (0,) * (self._ndim - 1)
        self.set_shape((int(length),) + tuple(tail), oversize)

    @runtime.action("Data.set_shape()")
    def set_shape(self, shape, oversize=1):
        """Change the shape (same ndim).  Values are kept only in the sense of
        ``set_length``; reallocates only if the allocation is too small."""
        oversize = _check_oversize(oversize)
        if not isinstance(shape, (list, tuple)) or not all(
                isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise TypeError("shape must be a list or tuple of non-negative ints, got %r" % (shape,))
        if len(shape) != self._ndim:
            raise TypeError("Data has ndim=%d, got shape %r" % (self._ndim, tuple(shape)))
        self._reshape(tuple(int(s) for s in shape), oversize, keep=True)

    @runtime.action("Data.free_memory()")
    def free_memory(self):
        """Release the shared memory in the master and the workers; the next
        ``set_value`` allocates anew (the only way to shrink an allocation)."""
        self._rt.check_owner()
        name = self._memory.release()
        if name is not None and not self._rt.closed:
            self._rt.dispatcher.request(DropData(name))

    # ------------------------------------------------------------------ internal
    def _reshape(self, shape, oversize, keep):
        self._rt.check_owner()
        items = int(np.prod(shape, dtype=np.int64))
        mem = self._memory
        if mem.segment is None or items > mem.capacity:
            self._allocate(max(int(items * oversize), items), mem.array if keep else None, items)
        mem.view(shape)

    def _allocate(self, items, keep, used):
        rt = self._rt
        if rt.closed:
            raise RuntimeError("Synkhronos is closed: Data memory cannot be allocated")
        name = self._memory.allocate(items, keep, used)
        # Ranks on other hosts (MPI launch) map their host's copy when a call needs it.
        rt.dispatcher.request(MapData(name), ranks=rt.local_workers())

    def _release(self):
        """Drop this process's memory (no message to workers)."""
        self._memory.release()

    def _ref(self):
        """Array ref to the current array, for the workers."""
        ref = self._memory.ref
        if ref is None:
            self._require_array()
        return ref

    def __del__(self):
        try:
            rt = self._rt
            if self._memory.segment is not None and not rt.closed and not rt.foreign:
                rt.dispatcher.forget_segment(self._memory.release())
        except Exception:
            pass


@runtime.action("synkhronos.data()")
def data(value=None, var=None, dtype=None, ndim=None, shape=None, minibatch=False,
         force_cast=False, oversize=1, name=None):
    """Create a ``Data`` object for function inputs.

    Like a PyTensor variable, a Data object has a fixed ``dtype`` and ``ndim``,
    taken from ``var``, from ``value``, or from ``dtype`` with ``ndim`` (or
    ``shape``).  Giving ``value`` or ``shape`` allocates memory at once.

    Parameters
    ----------
    value : array_like, optional
        Values to store.
    var : pytensor Variable, optional
        Variable whose ``dtype`` and ``ndim`` to use.
    dtype : str or numpy dtype, optional
    ndim : int, optional
    shape : tuple of int, optional
        Shape to allocate (ignored when ``value`` is given).
    minibatch : bool, optional
        See ``Data``.
    force_cast : bool, optional
        Convert ``value`` to the dtype without error.
    oversize : float in [1, 2], optional
        Allocate this factor more memory than needed.
    name : str, optional
        Default: ``var.name``.

    Returns
    -------
    Data

    Raises
    ------
    RuntimeError
        If Synkhronos is not forked.
    TypeError
        If dtype and ndim cannot be determined, or ``value`` does not match them.
    OSError
        Where ``/dev/shm`` has no room (see the docs page "Troubleshooting").
    """
    return make_data(value, var, dtype=dtype, ndim=ndim, shape=shape, minibatch=minibatch,
                     force_cast=force_cast, oversize=oversize, name=name, argname="synkhronos.data(value)")


def make_data(value, var=None, *, dtype=None, ndim=None, shape=None, minibatch=False, force_cast=False,
              oversize=1, name=None, argname):
    """``data()``, whose errors about ``value`` name it ``argname``
    (``Function.build_inputs`` names the input it is for)."""
    rt = runtime.require()
    minibatch = _check_flag(minibatch, "minibatch")
    force_cast = _check_flag(force_cast, "force_cast")
    if name is not None and not isinstance(name, str):
        raise TypeError("name must be a str or None, got %r" % (name,))
    if var is not None:
        dtype, ndim, name = _type_of_var(var, dtype, ndim, name)
    dtype, ndim = _dtype_and_ndim(value, dtype, ndim, shape, argname)
    _check_oversize(oversize)
    d = rt.registry.add_data(lambda ID: Data(ID, dtype, ndim, minibatch=minibatch, name=name))
    if value is not None:
        d._set_value(value, force_cast, oversize, argname)
    elif shape is not None:
        d.set_shape(shape, oversize=oversize)
    return d


def _type_of_var(var, dtype, ndim, name):
    """``(dtype, ndim, name)`` of PyTensor variable ``var``, checked against those
    given (``name`` given wins)."""
    from pytensor.tensor.variable import TensorVariable

    if not isinstance(var, TensorVariable):
        raise TypeError("var must be a PyTensor tensor variable, got %s" % (brief(var),))
    if dtype is not None and np.dtype(dtype) != np.dtype(var.dtype):
        raise TypeError("dtype %r conflicts with var.dtype %r" % (dtype, var.dtype))
    if ndim is not None and ndim != var.ndim:
        raise TypeError("ndim %r conflicts with var.ndim %r" % (ndim, var.ndim))
    return var.dtype, var.ndim, var.name if name is None else name


def _dtype_and_ndim(value, dtype, ndim, shape, argname):
    """The checked numpy dtype and ndim of new Data: those given, else ``value``'s,
    else (ndim) the length of ``shape``."""
    dtype_of_value = value is not None and dtype is None  # then a bad dtype is the value's fault
    if value is not None:
        arr = value.data if isinstance(value, Data) else _as_array(value, argname)
        if arr is None:
            raise ValueError("%s is a Data object with no memory: %r" % (argname, value))
        dtype = arr.dtype if dtype is None else dtype
        ndim = arr.ndim if ndim is None else ndim
    if ndim is None and shape is not None:
        if not isinstance(shape, (list, tuple)):
            raise TypeError("shape must be a list or tuple of ints, got %r" % (shape,))
        ndim = len(shape)
    if dtype is None or ndim is None:
        raise TypeError(
            "incomplete specification: give value, var, or dtype together with ndim or "
            "shape (got dtype=%r, ndim=%r)" % (dtype, ndim)
        )
    try:
        dtype = np.dtype(dtype)
    except (TypeError, ValueError):
        raise TypeError("dtype %r is not a numpy dtype" % (dtype,)) from None
    _check_dtype(dtype, argname if dtype_of_value else "dtype")
    if isinstance(ndim, bool) or not isinstance(ndim, numbers.Integral) or ndim < 0:
        raise TypeError("ndim must be a non-negative int, got %r" % (ndim,))
    return dtype, ndim
