"""GPU workers: one process per GPU, functions compiled with PyTensor's JAX linker,
shared values resident on the GPU as JAX arrays, collectives over NCCL (CuPy).

Memory policy: JAX does not pre-allocate (``XLA_PYTHON_CLIENT_PREALLOCATE=false``
unless the user set it), so NCCL and CuPy can allocate beside XLA; XLA still pools
what it has allocated.  Each process sees only its own GPU
(``CUDA_VISIBLE_DEVICES``), set before JAX or CuPy start.

Stream ordering: NCCL runs on its own CuPy stream; arrays cross between JAX and
CuPy through DLPack, whose stream hand-off makes each side wait for the other's
writes on the GPU.  Collectives therefore return once queued, and whatever reads
their results (a function call, ``get_value``, another collective) waits for them.
"""

import collections
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
import weakref

import numpy as np

from .._reduce import identity
from ._dlpack import cupy_exporter, jax_importer, untimed_event

__all__ = ["GpuDevice", "visible_gpus", "gpu_stack_available"]

_JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
# fork(precision=...) -> JAX's default precision of float32 matrix products and
# convolutions.  JAX's own default on Hopper is TensorFloat-32 (a 10-bit
# mantissa): ``x.dot(y)`` then differs from the CPU by ~1e-3 relative.
# bf16 is a graph rewrite (synkhronos._mixed): what it leaves in float32 stays full float32.
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


# Bytes of inputs of queued collectives the host may hold before it waits for
# the GPU.  Fewer calls queued ran faster: on 2 H200s, 64 MB all-reduces ran at
# 0.93-0.94x raw NCCL with 2 GB (32 calls queued), 0.97 with 256 MB and 0.98
# with 128 MB (two runs each, in one session); at 1 GB the limits did not differ.
_INFLIGHT_BYTES = 128 << 20
_NCCL_DTYPE_NAMES = ("float16", "float32", "float64", "int8", "uint8", "int32", "uint32",
                     "int64", "uint64")
_NCCL_TYPES = {}  # dtype, as given -> NCCL data type, filled on use


def _nccl_dtype(nccl, dtype):
    """NCCL's data type for ``dtype`` (a name or numpy dtype).  Cached as given:
    ``np.dtype(dtype).name`` alone took ~3 us, twice per variable and call."""
    try:
        return _NCCL_TYPES[dtype]
    except KeyError:
        pass
    name = np.dtype(dtype).name
    if name not in _NCCL_DTYPE_NAMES:
        raise TypeError("NCCL has no data type for %s; use nccl=False for the shared-memory "
                        "path" % dtype)
    _NCCL_TYPES[dtype] = getattr(nccl, "NCCL_" + name.upper())
    return _NCCL_TYPES[dtype]


class GpuDevice:
    """Device layer for GPU worker processes (see module docstring)."""

    name = "gpu"
    label = "GPUs"
    nccl = True
    queued = True  # device work is queued: calls without results need not wait for replies
    # Function outputs of static shape are reduced into the master over NCCL
    # (``reduce_outputs``, see ``reduces_outputs``) in these dtypes.
    reduce_dtypes = _NCCL_DTYPE_NAMES

    def __init__(self, gpu_ids=None, precision=None):
        self.gpu_ids = visible_gpus() if gpu_ids is None else list(gpu_ids)
        if precision is None:  # a worker: the master's choice comes in the environment
            jax_name = os.environ.get(_PRECISION_ENV, PRECISIONS["highest"])
            # Only JAX's setting travels: "bf16" is a rewrite the master applies.
            precision = next((k for k, v in PRECISIONS.items() if v == jax_name), jax_name)
        self.precision = precision
        self.one_node = True  # every rank on this machine (False: an MPI launch across nodes)
        self._comm = None
        self._stream = None
        self._inflight = collections.deque()  # (event, arrays the NCCL stream still uses, bytes)
        self._held = 0  # bytes in _inflight
        self.n_parallel = None
        self.rank = None
        self.wait_hook = None  # called while the master waits on its GPU
        self._import = None  # CuPy -> JAX, see jax_importer
        self._export = None  # JAX -> CuPy, see cupy_exporter
        self._copier = None  # (stream, JAX -> CuPy on it) for copies to the host, see to_host
        self._own = {}  # id(var) -> (weakref to its JAX value, the CuPy buffer under it)
        self._ops = None

    def available(self):
        return len(self.gpu_ids)

    @property
    def reduces_outputs(self):
        """Whether function outputs of static shape are reduced into the master
        over NCCL: then no rank waits to copy its outputs to the host (on 2 H200s
        this halved what a tiny call adds to the plain JAX-mode call).  Not on
        one rank, where there is nothing to reduce."""
        return bool(self.n_parallel and self.n_parallel > 1)

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
        from .._core import JAX_DTYPE_WARNING

        warnings.filterwarnings("ignore", message=JAX_DTYPE_WARNING, category=UserWarning)

    @property
    def status(self):
        """What the status line of ``fork()`` says about this device's numerics."""
        if self.precision == "highest":
            return "float32 matmul precision: highest (full float32)"
        if self.precision == "bf16":
            return ("float32 matmul precision: bf16 (bfloat16 matrix products and convolutions, "
                    "float32 accumulation and everything else)")
        return "float32 matmul precision: tf32 (TensorFloat-32, ~1e-3 relative error)"

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

    @staticmethod
    def _jax_value(var):
        """``var``'s value as a JAX array on this GPU (put there if it is not yet)."""
        import jax

        v = var.container.storage[0]
        if not isinstance(v, jax.Array):
            v = jax.device_put(np.asarray(v))
            var.container.storage[0] = v
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

    # -------------------------------------------------------------------- NCCL
    def init_comm(self, n_parallel, rank, uid):
        """Join the NCCL communicator (blocks until every rank has joined)."""
        import cupy
        from cupy.cuda import nccl

        self.n_parallel, self.rank = n_parallel, rank
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._comm = nccl.NcclCommunicator(n_parallel, uid, rank)
        self._warm_up()

    def _warm_up(self):
        """Build the DLPack bridges and load the CuPy kernels the collectives use,
        now, while no NCCL kernel runs: loading a kernel (and the bridges' probes,
        which wait on the host) can wait for the GPU's running kernels, and a
        collective stuck on a silent rank would then hang this process in CUDA,
        where no stall check can run."""
        import cupy

        self._import = jax_importer()
        self._export = cupy_exporter(self._stream)
        copies = cupy.cuda.Stream(non_blocking=True)
        self._copier = copies, cupy_exporter(copies)
        with self._stream:
            x = cupy.full((2,), 1, dtype=cupy.float32)
            (x * x.dtype.type(2)).astype(cupy.float64)
            cupy.zeros(2, dtype=cupy.float32)
            cupy.ascontiguousarray(cupy.concatenate([x, x]))
        self._stream.synchronize()

    @staticmethod
    def new_uid():
        from cupy.cuda import nccl

        return nccl.get_unique_id()

    def close(self, abort=False):
        """Leave the communicator; ``abort`` when a collective may be stuck."""
        self._inflight.clear()
        self._own.clear()
        self._copier = None
        self._held = 0
        if self._comm is not None:
            try:
                if abort:
                    self._comm.abort()
                else:
                    self._comm.destroy()
            except Exception:
                pass
            self._comm = None

    def synchronize(self, shareds):
        """Wait until every queued computation and collective on this GPU is done."""
        import jax

        for var in shareds:
            v = var.container.storage[0]
            if isinstance(v, jax.Array):
                v.block_until_ready()
        if self._stream is not None:
            self._stream.synchronize()
        self._inflight.clear()
        self._held = 0

    def to_host(self, values):
        """A rank's function outputs (or shared values) as numpy arrays.

        JAX arrays are copied through CuPy on a stream of their own: a CuPy view
        of each, ordered after XLA's writes to it (see ``cupy_exporter``), one
        wait for that stream, then a synchronous copy.  JAX's own route
        (``np.asarray``) took 145 us for a float32 scalar on an H100 after the
        computation was done, this one 24 us (view 9 us, copy 15 us);
        ``copy_to_host_async`` first saved only 17 us of the 145 and cost 48 us
        of host time itself.  The stream is not the NCCL stream, so the copy waits
        for what wrote these values only, not for every queued collective.  The
        wait goes through ``_wait_for``: in the master a worker's death is
        noticed even if a value waits on a collective the dead worker will never
        join.  Values JAX did not make on this GPU, and dtypes CuPy lacks
        (bfloat16), take JAX's route.
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

    # ------------------------------------------------------ function outputs
    def reduce_outputs(self, outputs, specs, weight, root):
        """Queue the reduction of one call's outputs into rank ``root`` over NCCL.

        ``specs`` gives ``(shape, dtype, mode)`` per output.  For ``avg`` each
        rank sends its output times ``weight`` (its rows) and ``take_outputs``
        divides by the total, as the host path weights it.  ``outputs`` None
        (this rank had no rows, or failed) sends identity values, as does an
        output of an unexpected shape, which then raises ValueError after.

        Returns
        -------
        list of CuPy arrays on ``root`` (for ``take_outputs``), else None.
        """
        import cupy
        from cupy.cuda import nccl

        problems, keep, results = [], [], []
        root_here = self.rank == root
        stream = self._stream
        with self._grouped(len(specs)), stream:
            for k, (shape, dtype, mode) in enumerate(specs):
                x = None
                if outputs is not None:
                    try:
                        x = self._output_buffer(outputs[k], shape, dtype, mode, weight, keep)
                    except Exception as exc:  # still take part: the other ranks wait for this one
                        problems.append("output %d on rank %d: %s" % (k, self.rank, exc))
                if x is None:
                    x = cupy.full(shape, identity(mode, dtype), dtype=dtype)
                out = cupy.empty(x.shape, x.dtype) if root_here else x
                # avg: the (weighted) parts are summed here and divided on the host.
                self._comm.reduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype),
                                  self._op("sum" if mode == "avg" else mode), root, stream.ptr)
                keep.append(x)
                results.append(out)
        self._retire(*keep)
        self._raise(problems)
        return results if root_here else None

    def _output_buffer(self, value, shape, dtype, mode, weight, keep):
        """A rank's output as a CuPy array on the NCCL stream (the current one),
        weighted for avg; a view of a JAX array goes to ``keep`` (held until the
        stream passes)."""
        import cupy
        import jax

        if tuple(np.shape(value)) != shape:
            raise ValueError("shape %s, but the graph says %s" % (tuple(np.shape(value)), shape))
        if isinstance(value, jax.Array):
            x = self._to_cupy(value)
            keep.append(x)
        else:  # a function the user compiled for the CPU
            x = cupy.asarray(np.asarray(value))
        if x.dtype != dtype:
            x = x.astype(dtype)
        if mode == "avg" and weight != 1:
            x = x * x.dtype.type(weight)
        return x

    def take_outputs(self, results):
        """Host copies of the reduced outputs ``reduce_outputs`` returned on root."""
        import cupy

        self._wait()
        return [cupy.asnumpy(r) for r in results]

    # The collectives below only queue work on the NCCL stream and return: DLPack
    # makes that stream wait for XLA's writes to an input, and XLA wait for NCCL's
    # writes to an output, with events on the GPU, not with host synchronisation.
    # Outputs go to fresh buffers, so nothing XLA may still read is overwritten;
    # inputs are kept alive until the stream has passed them.  Every rank is told
    # the shapes by the master; a rank whose own shape differs takes part with a
    # zero stand-in (so no rank waits forever) and raises afterwards.

    def _input(self, var, shape, problems):
        """(CuPy view of ``var``'s value on the NCCL stream, whether it is the
        real value or a stand-in of the expected ``shape``)."""
        import cupy

        value = self._jax_value(var)
        if tuple(value.shape) != tuple(shape):
            problems.append("%s has shape %s on rank %d but the master expected %s"
                            % (var, tuple(value.shape), self.rank, tuple(shape)))
            with self._stream:
                return cupy.zeros(shape, dtype=var.dtype), False
        own = self._own.get(id(var))
        if own is not None and own[0]() is value:
            return own[1], True  # written by this stream: stream order suffices
        return self._to_cupy(value), True

    def _to_cupy(self, value):
        """A CuPy view of JAX array ``value``, ordered on the NCCL stream after
        XLA's writes to it (see ``cupy_exporter``)."""
        if self._export is None:
            self._export = cupy_exporter(self._stream)
        return self._export(value)

    def _outputs(self, outputs, after=None):
        """Make each ``buf`` of ``outputs``' ``(var, buf)``, written on the NCCL
        stream, ``var``'s value.  The buffer is remembered while that value
        lives, so that a following collective on ``var`` reads it on the same
        stream, without a round trip through XLA's stream (on the GPU) and
        DLPack (on the host).  ``after``: an event already recorded on the NCCL
        stream after the buffers' writes, for JAX to wait on (else one is made)."""
        if not outputs:
            return
        if self._import is None:
            self._import = jax_importer()
        with self._stream:  # XLA's stream waits for this one
            values = self._import([buf for _, buf in outputs], after)
        own = self._own
        for (var, buf), value in zip(outputs, values):
            var.container.storage[0] = value
            own[id(var)] = (weakref.ref(value, functools.partial(_forget, own, id(var))), buf)

    def _finish(self, keep, outputs):
        """Close a collective: keep the arrays ``keep`` alive behind one event
        (``_retire``), then make each ``(var, buf)`` of ``outputs`` ``var``'s value.

        The imports into JAX come after every other CUDA call of the collective.
        JAX's import of a buffer that the NCCL stream is still writing makes this
        process's next CUDA call wait about as long as that write (measured on
        H200s: ~175 us at 64 MB).  Imported between the variables of a call, it
        made their NCCL kernels run one at a time, with the host's latency
        between them; imported last, the wait falls on the next collective's
        first NCCL launch, when the GPU has finished this one anyway."""
        self._outputs(outputs, self._retire(*keep))

    def _retire(self, *arrays):
        """Keep ``arrays`` alive until the NCCL stream has passed this point.  If
        more than ``_INFLIGHT_BYTES`` are held so, wait for the oldest: the host
        may run far ahead of the GPU, and each queued call holds its inputs.
        Returns the event recorded at this point."""
        queue = self._inflight
        while queue and queue[0][0].done:
            self._held -= queue.popleft()[2]
        nbytes = sum(a.nbytes for a in arrays)
        mark = self._mark()
        queue.append((mark, arrays, nbytes))
        self._held += nbytes
        while self._held > _INFLIGHT_BYTES and len(queue) > 1:
            event, _, old = queue.popleft()
            self._wait_for(event)
            self._held -= old
        return mark

    def _mark(self):
        """An (untimed) event recorded on the NCCL stream now."""
        return untimed_event(self._stream)

    def _wait(self):
        """Wait for the NCCL stream (see ``_wait_for``)."""
        self._wait_for(self._mark())

    def _wait_for(self, event):
        """Wait for ``event``; the master keeps checking the workers' replies
        meanwhile (``wait_hook``), so a worker's failure does not hang it."""
        if self.wait_hook is None:
            event.synchronize()
            return
        # Poll alone at first: a short wait (a tiny call's outputs) should not
        # pay for a sleep.
        checks_from = time.perf_counter() + 1e-3
        while not event.done:
            if time.perf_counter() > checks_from:
                self.wait_hook()
                time.sleep(20e-6)

    @staticmethod
    def check_collective(variables, op=None):
        """Raise TypeError, before any rank starts, for a dtype NCCL cannot move
        (NCCL reduces every dtype it moves under every ``op``)."""
        from cupy.cuda import nccl

        for var in variables:
            _nccl_dtype(nccl, var.dtype)

    @staticmethod
    def _raise(problems):
        if problems:
            raise ValueError("; ".join(problems))

    def _op(self, op):
        """NCCL's reduce operation for ``op``.  ``avg`` is NCCL's own (NCCL 2.10
        and later; CuPy may not name it): the sum scaled by 1/n inside the
        collective's kernel, with integer division for integers (truncated,
        as the shared-memory path truncates).  A separate scaling kernel took
        82 us at 64 MB on an H200, a third as long as the all-reduce itself.

        A communicator of one rank sums instead (the average of one value is
        that value): NCCL before 2.29.7 runs one-rank averages through a kernel
        that leaves the last elements of the result unwritten (NVIDIA/nccl#1950;
        seen with CuPy's NCCL 2.28.9 on an H100, in 7 of 40 float32 all-reduces
        of random lengths), and sums of one rank are a plain copy."""
        if self._ops is None:
            from cupy.cuda import nccl

            avg = getattr(nccl, "NCCL_AVG", 4) if self.n_parallel != 1 else nccl.NCCL_SUM
            self._ops = {"avg": avg, "sum": nccl.NCCL_SUM,
                         "prod": nccl.NCCL_PROD, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
        return self._ops[op]

    @staticmethod
    def _grouped(count):
        """A context that queues the NCCL calls made inside as one launch when
        there are several (``count``): one kernel for a call's variables instead
        of one each, with the host's work between them.  Nothing inside may read
        their results.  For one call, a context that does nothing (every
        collective enters one: no generator to build)."""
        return _NcclGroup() if count > 1 else _NO_GROUP

    def nccl_all_reduce(self, variables, op, shapes):
        import cupy
        from cupy.cuda import nccl

        problems, keep, outputs = [], [], []
        nccl_op = self._op(op)
        with self._grouped(len(variables)):
            for var, shape in zip(variables, shapes):
                x, real = self._input(var, shape, problems)
                with self._stream:
                    out = cupy.empty(x.shape, x.dtype)
                    self._comm.allReduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype),
                                         nccl_op, self._stream.ptr)
                keep.append(x)
                if real:
                    outputs.append((var, out))
        self._finish(keep, outputs)
        self._raise(problems)

    def nccl_reduce(self, variables, op, root, in_place, shapes):
        """Reduce into ``root``; returns host results there (None elsewhere)."""
        import cupy
        from cupy.cuda import nccl

        problems, outs, keep, outputs = [], [], [], []
        nccl_op = self._op(op)
        with self._grouped(len(variables)):
            for var, shape in zip(variables, shapes):
                x, real = self._input(var, shape, problems)
                with self._stream:
                    out = cupy.empty(x.shape, x.dtype) if self.rank == root else x
                    self._comm.reduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype),
                                      nccl_op, root, self._stream.ptr)
                keep.append(x)
                if self.rank == root and in_place and real:
                    outputs.append((var, out))
                outs.append(out)
        self._finish(keep, outputs)
        self._raise(problems)
        if self.rank != root or in_place:
            return []
        self._wait()
        return [cupy.asnumpy(out) for out in outs]

    def nccl_broadcast(self, variables, root, shapes):
        """Every rank takes ``root``'s values (of ``shapes``)."""
        import cupy
        from cupy.cuda import nccl

        problems, keep, outputs = [], [], []
        with self._grouped(len(variables)):
            for var, shape in zip(variables, shapes):
                if self.rank == root:
                    buf, _ = self._input(var, shape, problems)
                else:
                    with self._stream:
                        buf = cupy.empty(shape, dtype=var.dtype)
                    outputs.append((var, buf))
                with self._stream:
                    self._comm.bcast(buf.data.ptr, buf.size, _nccl_dtype(nccl, buf.dtype), root,
                                     self._stream.ptr)
                keep.append(buf)
        self._finish(keep, outputs)
        self._raise(problems)

    def nccl_gather(self, variables, root, shapes):
        """Root receives every rank's value by point-to-point transfers, sized by
        ``shapes[var][rank]``; returns host arrays per variable, per rank, on root."""
        import cupy
        from cupy.cuda import nccl

        problems, results, keep = [], [], []
        for var, per_rank in zip(variables, shapes):
            x, _ = self._input(var, per_rank[self.rank], problems)
            dt = _nccl_dtype(nccl, x.dtype)
            with self._stream:
                if self.rank == root:
                    bufs = [x if r == root else cupy.empty(per_rank[r], dtype=x.dtype)
                            for r in range(self.n_parallel)]
                    nccl.groupStart()
                    for r, b in enumerate(bufs):
                        if r != root and b.size:
                            self._comm.recv(b.data.ptr, b.size, dt, r, self._stream.ptr)
                    nccl.groupEnd()
                    results.append(bufs)
                elif x.size:
                    self._comm.send(x.data.ptr, x.size, dt, root, self._stream.ptr)
            keep.append(x)
        self._retire(*keep)
        self._raise(problems)
        if self.rank != root:
            return []
        self._wait()
        return [[cupy.asnumpy(b) for b in bufs] for bufs in results]

    def nccl_all_gather(self, variables, shapes):
        """Every rank's value becomes the concatenation (axis 0) of all ranks'
        values (``shapes[var][rank]``); unequal lengths are padded to the longest
        and trimmed after."""
        import cupy
        from cupy.cuda import nccl

        problems, keep, outputs = [], [], []
        for var, per_rank in zip(variables, shapes):
            x, real = self._input(var, per_rank[self.rank], problems)
            dt = _nccl_dtype(nccl, x.dtype)
            rows = sum(s[0] for s in per_rank)
            with self._stream:
                if len(set(per_rank)) == 1:  # rank-major output is already the concatenation
                    joined = cupy.empty((rows,) + x.shape[1:], dtype=x.dtype)
                    self._comm.allGather(x.data.ptr, joined.data.ptr, x.size, dt, self._stream.ptr)
                else:
                    sizes = [int(np.prod(s, dtype=np.int64)) for s in per_rank]
                    width = max(sizes)
                    send = cupy.zeros(width, dtype=x.dtype)
                    send[:x.size] = x.reshape(-1)
                    recv = cupy.empty(width * self.n_parallel, dtype=x.dtype)
                    self._comm.allGather(send.data.ptr, recv.data.ptr, width, dt, self._stream.ptr)
                    parts = [recv[r * width:r * width + sizes[r]].reshape(per_rank[r])
                             for r in range(self.n_parallel)]
                    joined = cupy.ascontiguousarray(cupy.concatenate(parts))
                    keep += [send, recv]
            keep.append(x)
            if real:
                outputs.append((var, joined))
        self._finish(keep, outputs)
        self._raise(problems)


class _NcclGroup:
    """NCCL's groupStart/groupEnd as a context (see ``GpuDevice._grouped``)."""

    def __enter__(self):
        from cupy.cuda import nccl

        nccl.groupStart()

    def __exit__(self, *exc):
        from cupy.cuda import nccl

        nccl.groupEnd()
        return False


_NO_GROUP = contextlib.nullcontext()


def _forget(own, key, ref):
    """Weakref callback: drop ``own[key]`` if it still belongs to ``ref``'s value."""
    if own.get(key, (None,))[0] is ref:
        del own[key]


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
