"""Environment and numerics of GPU ranks: which GPUs there are, what each
rank's process is told (its GPU, JAX's memory and matmul precision, NCCL's
settings), and how JAX is configured to match PyTensor."""

import os
import shutil
import subprocess

from ..cpu import jax_started

__all__ = ["EnvMixin", "visible_gpus", "gpu_stack_available", "PRECISIONS"]

_JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
# fork(precision=...) -> JAX's default precision of float32 matrix products and
# convolutions.  JAX's own default on Hopper is TensorFloat-32 (a 10-bit
# mantissa): ``x.dot(y)`` then differs from the CPU by ~1e-3 relative.
# bf16 is a graph rewrite (synkhronos._graph.bf16): what it leaves in float32 stays full float32.
PRECISIONS = {"highest": "highest", "tf32": "tensorfloat32", "bf16": "highest"}
_PRECISION_ENV = "JAX_DEFAULT_MATMUL_PRECISION"
_SAVED_IDS = "SYNK_GPU_IDS"  # the GPUs the master could see before fork() narrowed it
# NVLink multicast stays off: NCCL's NVLS can take a shared host's GPUs out of service.
# NCCL's bootstrap listens on a TCP socket: on one host, loopback is all it needs,
# so no other machine can reach it.
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo"}


def visible_gpus():
    """Identifiers of the GPUs this process may use (CUDA_VISIBLE_DEVICES or
    ``nvidia-smi -L``), without starting CUDA here.  After a ``fork()`` narrowed
    this process to its own GPU, the list from before."""
    saved = os.environ.get(_SAVED_IDS)
    if saved is not None:
        return [d for d in saved.split(",") if d]
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def gpu_stack_available():
    """Whether JAX and CuPy are installed (without importing them)."""
    from importlib.util import find_spec

    return find_spec("jax") is not None and find_spec("cupy") is not None


class EnvMixin:
    """Start-up of ``GpuDevice``: GPUs, environment, JAX's settings."""

    def available(self):
        return len(self.gpu_ids)

    def _env(self, rank):
        env = {"CUDA_VISIBLE_DEVICES": self.gpu_ids[rank],
               _PRECISION_ENV: PRECISIONS[self.precision]}
        for k, v in list(_JAX_ENV.items()) + list(_NCCL_ENV.items()):
            if k == "NCCL_SOCKET_IFNAME" and not self.one_node:
                continue  # NCCL's bootstrap must leave loopback to reach other nodes
            env[k] = os.environ.get(k, v)
        return env

    def configure_jax(self):
        """Set JAX's numerics on this rank:

        - float32 products at ``self.precision`` (see ``PRECISIONS``);
        - 64-bit mode as PyTensor's JAX backend sets it (on when ``floatX`` is
          float64), applied again in case that backend was imported before
          ``fork()`` settled ``floatX``.  With float32, JAX keeps 64-bit values
          in 32 bits on the device (PyTensor's float32 graphs need that: with
          64-bit mode on, parts of its JAX backend compute float32 updates in
          float64); function outputs still come back in the graph's dtypes;
        - JAX's warnings that it keeps an int64 or float64 value in 32 bits are
          not shown on this rank: PyTensor's backend asks for such values itself
          (index arithmetic, float64 accumulators of float32 sums), and a user
          cannot act on them.
        """
        import warnings

        import jax
        import pytensor
        import pytensor.link.jax.dispatch  # noqa: F401

        jax.config.update("jax_enable_x64", pytensor.config.floatX == "float64")
        jax.config.update("jax_default_matmul_precision", PRECISIONS[self.precision])
        from ..._common.compiler_warnings import JAX_DTYPE_WARNING

        warnings.filterwarnings("ignore", message=JAX_DTYPE_WARNING, category=UserWarning)

    @property
    def status(self):
        """What the status line of ``fork()`` says about this device's numerics:
        the precision of float32 products, and what float64 values become."""
        import pytensor

        if self.precision == "highest":
            products = "float32 matmul precision: highest (full float32)"
        elif self.precision == "bf16":
            products = ("float32 matmul precision: bf16 (bfloat16 matrix products, convolutions and "
                        "activations; float32 accumulation, statistics, loss and parameters)")
        else:
            products = "float32 matmul precision: tf32 (TensorFloat-32, ~1e-3 relative error)"
        if pytensor.config.floatX == "float64":
            return products + "; floatX float64: float64 graphs run in float64"
        return products + "; floatX float32: float64 and int64 values are kept in 32 bits on the GPU"

    def worker_env(self, rank, n_parallel):
        return self._env(rank)

    def setup_master(self, rank):
        """Make the master process see only its own GPU, before JAX starts."""
        mine = self.gpu_ids[rank]
        if jax_started(if_unknown=False) and os.environ.get("CUDA_VISIBLE_DEVICES") != mine:
            raise RuntimeError(
                "JAX already runs in this process on GPU %s, so the master cannot use GPU %s "
                "(master_rank=%d): call synkhronos.fork() before running anything with JAX "
                "(importing it is fine), or keep the same master_rank"
                % (os.environ.get("CUDA_VISIBLE_DEVICES", "all"), mine, rank))
        os.environ.setdefault(_SAVED_IDS, ",".join(self.gpu_ids))
        os.environ.update(self._env(rank))

    def function_kwargs(self, kwargs):
        """Compile every Synkhronos function for the GPU unless told otherwise."""
        kwargs = dict(kwargs)
        kwargs.setdefault("mode", "JAX")
        return kwargs
