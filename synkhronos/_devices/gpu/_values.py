"""Shared values on a GPU rank: reading, setting and placing shared variables'
values (JAX arrays on this GPU), copies to the host, and the numpy interface of
the master's shared variables."""

import numpy as np

from ._dlpack import untimed_event

__all__ = ["ValuesMixin"]


class ValuesMixin:
    """Shared values of ``GpuDevice``: JAX arrays on this GPU, numpy on the host."""

    # ------------------------------------------------------------------ values
    # The container is read directly: in the master, ``var.get_value`` is the
    # user-facing wrapper of ``numpy_interface``, which first settles posted work.
    def get_value(self, var):
        """Value of shared variable ``var`` on this rank, copied to the host
        (a new array, see ``to_host``)."""
        return self.to_host([var.container.storage[0]])[0]

    def shape(self, var):
        """Shape of ``var``'s value on this rank (no copy)."""
        return tuple(np.shape(var.container.storage[0]))

    def set_value(self, var, value):
        """Put ``value`` (host or device array) on this GPU as ``var``'s value."""
        import jax

        if not isinstance(value, jax.Array):
            value = np.array(value, dtype=var.dtype, copy=True)
        var.container.storage[0] = jax.device_put(value)
        self._put(var)

    def _jax_value(self, var):
        """``var``'s value as a JAX array on this GPU (put there if it is not yet)."""
        import jax

        v = var.container.storage[0]
        if not isinstance(v, jax.Array):
            v = jax.device_put(np.asarray(v))
            var.container.storage[0] = v
            self._put(var)
        return v

    def device_value(self, var):
        """``var``'s value as a ready JAX array on this GPU."""
        return self._jax_value(var).block_until_ready()

    def place_shareds(self, shareds):
        """Move every array-valued shared variable onto this GPU (once, at
        distribution); others, like random generators, stay as they are."""
        for var in shareds:
            if _is_array(var.container.storage[0]):
                self.device_value(var)

    def numpy_interface(self, shareds, on_set, before_get):
        """In the master, make ``var.get_value()`` return numpy and
        ``var.set_value()`` keep the value on the GPU, as a PyTensor user expects
        (``return_internal_type=True`` still gives the JAX array).  ``on_set(var)``
        runs after a new value is set; ``before_get()`` before a value is read."""
        for var in shareds:
            if _is_array(var.container.storage[0]):
                _numpy_interface(var, self, on_set, before_get)

    def to_host(self, values):
        """A rank's function outputs (or shared values) as numpy arrays.

        JAX arrays are copied through CuPy on a stream of their own: a CuPy view
        of each, ordered after XLA's writes to it (see ``cupy_exporter``), one
        wait for that stream, then a synchronous copy.  JAX's own route
        (``np.asarray``, with or without ``copy_to_host_async`` first) takes
        several times as long for a small value, which every call with outputs
        would pay (see the docs page "Benchmarks", *Design decisions*).  The
        stream is not the NCCL stream, so the copy waits for what wrote these
        values only, not for every queued collective.  The wait goes through
        ``_wait_for``: in the master a worker's death is noticed even if a value
        waits on a collective the dead worker will never join.  Values JAX did
        not make on this GPU, and dtypes CuPy lacks (bfloat16), take JAX's route.
        """
        import jax

        out = list(values)
        views = []
        if self._copier is not None:
            stream, export = self._copier
            for i, v in enumerate(values):
                if isinstance(v, jax.Array):
                    try:
                        views.append((i, export(v)))
                    except Exception:  # not on this GPU, or a dtype CuPy does not know
                        pass
        if views:
            self._wait_for(untimed_event(stream))
            for i, x in views:
                out[i] = x.get(stream=stream)
        return [v if isinstance(v, np.ndarray) else np.asarray(v) for v in out]


def _is_array(value):
    """Whether ``value`` is a tensor's value (a random generator, say, is not)."""
    import jax

    return isinstance(value, (np.ndarray, np.generic, jax.Array))


def _numpy_interface(var, device, on_set, before_get):
    cls_get = type(var).get_value

    def get_value(borrow=False, return_internal_type=False):
        before_get()
        value = cls_get(var, borrow=True, return_internal_type=True)
        if return_internal_type:
            return value
        if isinstance(value, np.ndarray):
            return value if borrow else value.copy()
        return device.to_host([value])[0]  # a new array either way

    def set_value(new_value, borrow=False):
        device.set_value(var, new_value)
        on_set(var)

    get_value.__doc__ = cls_get.__doc__
    var.get_value = get_value
    var.set_value = set_value
