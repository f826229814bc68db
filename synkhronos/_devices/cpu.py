"""CPU workers: one process per core group, BLAS threads split between them."""

import os
import sys

import numpy as np

from ._base import Device

__all__ = ["CpuDevice", "usable_cores"]

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def usable_cores():
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class CpuDevice(Device):
    """Device layer for CPU worker processes: a call's work is done when its
    reply comes; function outputs are reduced in the master; collectives go
    through shared memory.  ``precision`` 'tf32' computes in full float32 too;
    'bf16' is emulated (``synkhronos._mixed``)."""

    name = "cpu"
    label = "CPU cores"

    @property
    def status(self):
        """What the status line of ``fork()`` says about this device's numerics."""
        if self.precision == "bf16":
            return "bf16 matrix products and convolutions emulated with numpy (slow)"
        return ""

    def available(self):
        return usable_cores()

    @staticmethod
    def configure_jax():
        """Functions the user compiles with ``mode="JAX"`` follow PyTensor's rule
        (64-bit mode when ``floatX`` is float64).  PyTensor applies it when its JAX
        backend is first imported; if that happened before ``fork()`` settled
        ``floatX`` (say, an extension registering JAX implementations was imported
        first), apply it again now."""
        if "pytensor.link.jax.dispatch.basic" in sys.modules:
            import jax
            import pytensor

            jax.config.update("jax_enable_x64", pytensor.config.floatX == "float64")

    def worker_env(self, rank, n_parallel):
        """Environment of worker ``rank``: its share of the BLAS threads,
        unless the user already fixed them."""
        threads = str(max(1, usable_cores() // n_parallel))
        return {v: os.environ.get(v, threads) for v in _THREAD_VARS}

    def setup_master(self, rank):
        """Nothing to set up: the master keeps its own threads."""

    @staticmethod
    def to_host(values):
        """A rank's function outputs as numpy arrays (on CPU workers they are
        already on the host)."""
        return [np.asarray(v) for v in values]

    def get_value(self, var):
        """The value of shared variable ``var`` on this rank, as numpy."""
        return np.asarray(var.get_value(borrow=True))

    def shape(self, var):
        """Shape of ``var``'s value on this rank."""
        return tuple(np.shape(var.get_value(borrow=True)))

    def set_value(self, var, value):
        """Overwrite shared variable ``var`` on this rank with a private copy of
        ``value`` (which may be a view of memory another rank will reuse)."""
        var.set_value(np.array(value, dtype=var.dtype, copy=True), borrow=True)
