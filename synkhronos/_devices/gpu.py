"""GPU workers: one process per GPU, functions compiled with PyTensor's JAX linker,
shared values resident on the GPU as JAX arrays, collectives over NCCL (CuPy).

Memory policy: JAX does not pre-allocate (``XLA_PYTHON_CLIENT_PREALLOCATE=false``
unless the user set it), so NCCL and CuPy can allocate beside XLA; XLA still pools
what it has allocated.  Each process sees only its own GPU
(``CUDA_VISIBLE_DEVICES``), set before JAX or CuPy start.

Stream ordering: a JAX array is made ready (``block_until_ready``) before NCCL
reads it through DLPack, NCCL writes only into fresh CuPy buffers, and the NCCL
stream is synchronised before JAX takes those buffers over.
"""

import os
import shutil
import subprocess
import sys

import numpy as np

__all__ = ["GpuDevice", "visible_gpus", "gpu_stack_available"]

_JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
_SAVED_IDS = "SYNK_GPU_IDS"  # the GPUs the master could see before fork() narrowed it
# NVLink multicast stays off: NCCL's NVLS can take a shared host's GPUs out of service.
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


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


def _nccl_dtype(nccl, dtype):
    table = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64, "float16": nccl.NCCL_FLOAT16,
             "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64, "uint8": nccl.NCCL_UINT8,
             "int8": nccl.NCCL_INT8, "uint32": nccl.NCCL_UINT32, "uint64": nccl.NCCL_UINT64}
    try:
        return table[np.dtype(dtype).name]
    except KeyError:
        raise TypeError("NCCL has no data type for %s" % dtype) from None


class GpuDevice:
    """Device layer for GPU worker processes (see module docstring)."""

    name = "gpu"
    label = "GPUs"
    nccl = True

    def __init__(self, gpu_ids=None):
        self.gpu_ids = visible_gpus() if gpu_ids is None else list(gpu_ids)
        self._comm = None
        self._stream = None
        self.n_parallel = None
        self.rank = None

    def available(self):
        return len(self.gpu_ids)

    def _env(self, rank):
        env = {"CUDA_VISIBLE_DEVICES": self.gpu_ids[rank]}
        for k, v in list(_JAX_ENV.items()) + list(_NCCL_ENV.items()):
            env[k] = os.environ.get(k, v)
        return env

    def worker_env(self, rank, n_parallel):
        return self._env(rank)

    def setup_master(self, rank):
        """Make the master process see only its own GPU, before JAX starts."""
        started = False
        if "jax" in sys.modules:
            try:
                from jax._src import xla_bridge

                started = bool(xla_bridge._backends)
            except Exception:
                started = False
        mine = self.gpu_ids[rank]
        if started and os.environ.get("CUDA_VISIBLE_DEVICES") != mine:
            raise RuntimeError(
                "JAX already runs in this process on GPU %s, so the master cannot use GPU %s "
                "(master_rank=%d): call synkhronos.fork() before running anything with JAX "
                "(importing it is fine), or keep the same master_rank"
                % (os.environ.get("CUDA_VISIBLE_DEVICES", "all"), mine, rank))
        os.environ.setdefault(_SAVED_IDS, ",".join(self.gpu_ids))
        os.environ.update(self._env(rank))

    # ------------------------------------------------------------------ values
    def function_kwargs(self, kwargs):
        """Compile every Synkhronos function for the GPU unless told otherwise."""
        kwargs = dict(kwargs)
        kwargs.setdefault("mode", "JAX")
        return kwargs

    def get_value(self, var):
        """Value of shared variable ``var`` on this rank, copied to the host."""
        return np.asarray(var.get_value(borrow=True, return_internal_type=True))

    def shape(self, var):
        """Shape of ``var``'s value on this rank (no copy)."""
        return tuple(var.get_value(borrow=True, return_internal_type=True).shape)

    def set_value(self, var, value):
        """Put ``value`` (host or device array) on this GPU as ``var``'s value."""
        import jax

        if not isinstance(value, jax.Array):
            value = np.array(value, dtype=var.dtype, copy=True)
        var.container.storage[0] = jax.device_put(value)

    def device_value(self, var):
        """``var``'s value as a ready JAX array on this GPU."""
        import jax

        v = var.get_value(borrow=True, return_internal_type=True)
        if not isinstance(v, jax.Array):
            v = jax.device_put(np.asarray(v))
            var.container.storage[0] = v
        return v.block_until_ready()

    def place_shareds(self, shareds):
        """Move every shared value onto this GPU (once, at distribution)."""
        for var in shareds:
            self.device_value(var)

    def numpy_interface(self, shareds):
        """In the master, make ``var.get_value()`` return numpy and
        ``var.set_value()`` keep the value on the GPU, as a PyTensor user expects
        (``return_internal_type=True`` still gives the JAX array)."""
        for var in shareds:
            _numpy_interface(var, self)

    # -------------------------------------------------------------------- NCCL
    def init_comm(self, n_parallel, rank, uid):
        """Join the NCCL communicator (blocks until every rank has joined)."""
        import cupy
        from cupy.cuda import nccl

        self.n_parallel, self.rank = n_parallel, rank
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._comm = nccl.NcclCommunicator(n_parallel, uid, rank)

    @staticmethod
    def new_uid():
        from cupy.cuda import nccl

        return nccl.get_unique_id()

    def close(self):
        if self._comm is not None:
            try:
                self._comm.destroy()
            except Exception:
                pass
            self._comm = None

    def _cupy(self, var):
        import cupy

        return cupy.from_dlpack(self.device_value(var))

    def _to_var(self, var, buf):
        import jax

        self._stream.synchronize()
        var.container.storage[0] = jax.dlpack.from_dlpack(buf)

    def _op(self, op):
        from cupy.cuda import nccl

        return {"avg": nccl.NCCL_SUM, "sum": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD,
                "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}[op]

    def _shape_table(self, var, x):
        """Every rank's shape of ``var`` (its own is ``x.shape``), exchanged over NCCL
        so that every rank sees the same table and decides the same way."""
        import cupy
        from cupy.cuda import nccl

        width = 1 + max(var.ndim, 1)
        mine = np.zeros(width, dtype=np.int64)
        mine[0] = x.ndim
        mine[1:1 + x.ndim] = x.shape
        with self._stream:
            send = cupy.asarray(mine)
            recv = cupy.empty(width * self.n_parallel, dtype=cupy.int64)
            self._comm.allGather(send.data.ptr, recv.data.ptr, width, nccl.NCCL_INT64, self._stream.ptr)
            table = cupy.asnumpy(recv, stream=self._stream)
        self._stream.synchronize()
        rows = table.reshape(self.n_parallel, width)
        return [tuple(int(d) for d in row[1:1 + row[0]]) for row in rows]

    def _same_shapes(self, var, x, what):
        shapes = self._shape_table(var, x)
        if len(set(shapes)) > 1:
            raise ValueError("cannot %s %s: its shapes differ between ranks: %s" % (what, var, shapes))

    def nccl_all_reduce(self, variables, op):
        import cupy
        from cupy.cuda import nccl

        for var in variables:
            x = self._cupy(var)
            self._same_shapes(var, x, "reduce")
            with self._stream:
                out = cupy.empty_like(x)
                self._comm.allReduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype),
                                     self._op(op), self._stream.ptr)
                if op == "avg":
                    out *= x.dtype.type(1.0 / self.n_parallel)
            self._to_var(var, out)

    def nccl_reduce(self, variables, op, root, in_place):
        """Reduce into ``root``; returns host results there (None elsewhere)."""
        import cupy
        from cupy.cuda import nccl

        results = []
        for var in variables:
            x = self._cupy(var)
            self._same_shapes(var, x, "reduce")
            with self._stream:
                out = cupy.empty_like(x) if self.rank == root else x
                self._comm.reduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype),
                                  self._op(op), root, self._stream.ptr)
                if self.rank != root:
                    continue
                if op == "avg":
                    out *= x.dtype.type(1.0 / self.n_parallel)
            if in_place:
                self._to_var(var, out)
            else:
                self._stream.synchronize()
                results.append(cupy.asnumpy(out))
        self._stream.synchronize()
        return results

    def nccl_broadcast(self, variables, root, shapes, dtypes):
        """Every rank takes ``root``'s values (``shapes`` as on root)."""
        import cupy
        from cupy.cuda import nccl

        for var, shape, dtype in zip(variables, shapes, dtypes):
            if self.rank == root:
                out = self._cupy(var)
            else:
                with self._stream:
                    out = cupy.empty(shape, dtype=dtype)
            self._comm.bcast(out.data.ptr, int(np.prod(shape, dtype=np.int64)), _nccl_dtype(nccl, dtype),
                             root, self._stream.ptr)
            if self.rank != root:
                self._to_var(var, out)
        self._stream.synchronize()

    def nccl_gather(self, variables, root):
        """Root receives every rank's value by point-to-point transfers, sized by
        the exchanged shapes; returns host arrays per variable, per rank, on root."""
        import cupy
        from cupy.cuda import nccl

        results = []
        for var in variables:
            x = self._cupy(var)
            shapes = self._shape_table(var, x)
            dt = _nccl_dtype(nccl, x.dtype)
            if self.rank == root:
                with self._stream:
                    bufs = [x if r == root else cupy.empty(shapes[r], dtype=x.dtype)
                            for r in range(self.n_parallel)]
                nccl.groupStart()
                for r, b in enumerate(bufs):
                    if r != root and b.size:
                        self._comm.recv(b.data.ptr, b.size, dt, r, self._stream.ptr)
                nccl.groupEnd()
                self._stream.synchronize()
                results.append([cupy.asnumpy(b) for b in bufs])
            elif x.size:
                self._comm.send(x.data.ptr, x.size, dt, root, self._stream.ptr)
        self._stream.synchronize()
        return results

    def nccl_all_gather(self, variables):
        """Every rank's value becomes the concatenation (axis 0) of all ranks'
        values; unequal lengths are padded to the longest and trimmed after."""
        import cupy
        from cupy.cuda import nccl

        for var in variables:
            x = self._cupy(var)
            shapes = self._shape_table(var, x)
            if x.ndim == 0 or len({s[1:] for s in shapes}) > 1:
                raise ValueError("cannot concatenate values of %s with shapes %s along axis 0"
                                 % (var, shapes))
            sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
            width = max(sizes)
            with self._stream:  # copies, NCCL and slicing all in order on one stream
                send = cupy.zeros(width, dtype=x.dtype)
                send[:x.size] = x.reshape(-1)
                recv = cupy.empty(width * self.n_parallel, dtype=x.dtype)
                self._comm.allGather(send.data.ptr, recv.data.ptr, width, _nccl_dtype(nccl, x.dtype),
                                     self._stream.ptr)
                parts = [recv[r * width:r * width + sizes[r]].reshape(shapes[r])
                         for r in range(self.n_parallel)]
                joined = cupy.ascontiguousarray(cupy.concatenate(parts))
            self._to_var(var, joined)


def _numpy_interface(var, device):
    cls_get = type(var).get_value

    def get_value(borrow=False, return_internal_type=False):
        value = cls_get(var, borrow=True, return_internal_type=True)
        if return_internal_type:
            return value
        return np.asarray(value) if borrow else np.array(value)

    def set_value(new_value, borrow=False):
        device.set_value(var, new_value)

    get_value.__doc__ = cls_get.__doc__
    var.get_value = get_value
    var.set_value = set_value
