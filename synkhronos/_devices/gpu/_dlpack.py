"""The DLPack bridge between JAX (XLA's streams) and CuPy (the NCCL stream).

Both directions call JAX's DLPack functions directly, which is JAX-internal:
each bridge checks itself on a probe array and falls back to the public API if
anything is missing or wrong.  Stream order is kept on the GPU with untimed
events, never by waiting on the host.
"""

import warnings

import numpy as np

__all__ = ["untimed_event", "jax_importer", "cupy_exporter"]


def untimed_event(stream=None):
    """An event recorded on ``stream`` (the current one if None), without timing.

    CuPy's default event records a timestamp, which leaves the GPU idle between
    back-to-back NCCL kernels (see the docs page "Benchmarks", *Design
    decisions*)."""
    import cupy

    event = cupy.cuda.Event(disable_timing=True)
    event.record(stream)
    return event


def jax_importer():
    """A function taking a list of CuPy arrays (inside ``with stream:``), and
    optionally an event recorded on that stream after their writes, to JAX
    arrays on the same memory, ordered after that stream's work.

    ``jax.dlpack.from_dlpack`` does this, but spends most of its time in Python
    (device lookup, then an ``asarray`` that changes nothing for a canonical
    dtype), which every queued collective would pay.  So the same steps
    are taken here once and JAX's DLPack import is called directly, with the
    stream hand-off done here (see ``fast``).  That import is JAX-internal: if
    it is missing, has another signature, or gives a wrong result on a probe
    array, the public function is used instead."""
    import jax

    def public(bufs, after=None):
        del after  # JAX's own hand-off orders the import
        return [jax.dlpack.from_dlpack(b) for b in bufs]

    try:
        import cupy
        from jax._src import dtypes
        from jax._src.lib import _jax, jaxlib_extension_version
        from jax._src.typing import DLDeviceType

        (device,) = jax.local_devices()
        stream = device.get_stream_for_external_ready_events()
        with warnings.catch_warnings():  # CuPy 14 deprecates it for a protocol XLA's stream lacks
            warnings.simplefilter("ignore", DeprecationWarning)
            ready = cupy.cuda.ExternalStream(stream)
        extra = (int(DLDeviceType.kDLCUDA),) if jaxlib_extension_version >= 467 else ()

        def fast(bufs, after=None):
            # XLA's ready stream waits once for the current stream's work so
            # far, with an untimed event (``untimed_event``; ``after`` if the
            # caller has just recorded one there), and CuPy is asked for no
            # hand-off of its own (-1): its own records a timed event per
            # array (see ``untimed_event``).
            ready.wait_event(untimed_event() if after is None else after)
            return [_jax.dlpack_managed_tensor_to_buffer(b.__dlpack__(stream=-1), device, stream,
                                                         None, *extra)
                    if dtypes.canonicalize_dtype(b.dtype) == b.dtype else jax.dlpack.from_dlpack(b)
                    for b in bufs]

        probe = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
        (got,) = fast([probe])
        if not isinstance(got, jax.Array) or got.shape != (2, 3) or \
                np.asarray(got).tolist() != [[0, 1, 2], [3, 4, 5]]:
            return public
        return fast
    except Exception:
        return public


def cupy_exporter(stream):
    """A function taking a JAX array to a CuPy view of the same memory, ordered
    after XLA's writes to it on ``stream``.

    ``cupy.from_dlpack(array)`` does this, but JAX's ``__dlpack__`` first looks up
    in Python the device it was asked for, on every call (see the docs page
    "Benchmarks", *Design decisions*).  JAX's DLPack export is called directly
    instead and its capsule handed to CuPy.  That export is JAX-internal: if it is missing or
    gives a wrong result on a probe array, the public route is used."""
    import cupy

    def public(value):
        with stream:
            return cupy.from_dlpack(value)

    try:
        import jax.numpy as jnp
        from jax._src.lib import _jax

        probe = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
        device = probe.__dlpack_device__()

        class Capsule:
            __slots__ = ("capsule",)

            def __dlpack__(self, **_):
                return self.capsule

            def __dlpack_device__(self):
                return device

        def fast(value):
            made = Capsule()
            made.capsule = _jax.buffer_to_dlpack_managed_tensor(value, stream=stream.ptr)
            with stream:
                return cupy.from_dlpack(made)

        got = fast(probe)
        stream.synchronize()
        if got.shape != (2, 3) or cupy.asnumpy(got).tolist() != [[0, 1, 2], [3, 4, 5]]:
            return public
        return fast
    except Exception:
        return public
