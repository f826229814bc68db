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
import os

from .._base import Device
from ._collectives import _NCCL_DTYPE_NAMES, CollectivesMixin
from ._env import _PRECISION_ENV, PRECISIONS, EnvMixin, gpu_stack_available, visible_gpus
from ._outputs import OutputsMixin
from ._pinning import PinningMixin
from ._stream import StreamMixin
from ._values import ValuesMixin

__all__ = ["GpuDevice", "visible_gpus", "gpu_stack_available", "PRECISIONS", "GPU_SPIN_S"]

GPU_SPIN_S = 5e-3  # see GpuDevice.spin_s


class GpuDevice(EnvMixin, ValuesMixin, StreamMixin, CollectivesMixin, OutputsMixin, PinningMixin, Device):
    """Device layer for GPU worker processes (see module docstring)."""

    name = "gpu"
    label = "GPUs"
    has_collectives = True
    queued = True  # device work is queued: calls without results need not wait for replies
    # Function outputs of static shape are reduced into the master over NCCL
    # (``reduce_outputs``, see ``reduces_outputs``) in these dtypes.
    reduce_dtypes = _NCCL_DTYPE_NAMES
    # A GPU call takes hundreds of microseconds: every rank's wait for the next
    # message (and the master's for replies) outlasts a CPU rank's 100 us poll,
    # and a rank woken from sleep wakes late.  GPU hosts have cores to spare.
    spin_s = GPU_SPIN_S

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
        self._updated_by = {}  # id(core) -> core called since the last synchronize()
        self._set_since = {}  # id(var) -> var given a value since then (see _unsynced_vars)
        self._gpu = None  # JAX's device in this process, see _jax_device
        self._pinned_kept = {}  # (output, shape, dtype) -> (GPU, page-locked host) arrays, see _landing
        self._sharding_seen = {}  # id(sharding) -> (it, on NCCL's GPU), see _on_nccl_gpu
        self._staging = {}  # scattered input -> page-locked buffer its gathered rows go to (input_rows)
        self._gather_pool = None  # threads of large gathers (_pinning), made at the first
        self._ops = None
