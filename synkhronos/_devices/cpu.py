"""CPU workers: one process per core group, BLAS and OpenMP threads split
between them: every rank, the master included, gets its share of its host's
cores (docs: "CPU workers")."""

import importlib.util
import logging
import os
import sys

import numpy as np

from .._common.aligned import aligned_copy
from .._common.cores import usable_cores
from ._base import Device

logger = logging.getLogger("synkhronos")

__all__ = ["CpuDevice", "usable_cores", "THREAD_VARS", "thread_share", "limit_threads", "thread_pools",
           "core_share", "start_jax_pool", "worker_jax_cores", "jax_by_default", "forked_after_jax",
           "jax_started"]

# The variables by which a user fixes thread counts; any of them set means the
# user chose, and no rank's threads are changed.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def thread_share(ranks_here, threads=None):
    """Threads for each rank's BLAS and OpenMP pools: ``threads`` when the user
    passed it to ``fork()``; None when the user set any of ``THREAD_VARS`` (their
    choice stands); else this host's usable cores split evenly among its
    ``ranks_here`` ranks, at least one each."""
    if threads is not None:
        return threads
    if any(os.environ.get(v) for v in THREAD_VARS):
        return None
    return max(1, usable_cores() // ranks_here)


def limit_threads(count):
    """Give this process's BLAS and OpenMP pools ``count`` threads: those loaded
    now through threadpoolctl, those loaded later (PyTensor's linkers load SciPy's
    own BLAS at their first product) through ``THREAD_VARS``, which a library
    reads as it loads.  Returns a function that undoes both (None for ``count``
    None): the variables as they were, the pools loaded before as they were, and
    those loaded since at the size they would have had (the cores)."""
    if count is None:
        return None
    from threadpoolctl import ThreadpoolController

    saved_env = {v: os.environ.get(v) for v in THREAD_VARS}
    os.environ.update({v: str(count) for v in THREAD_VARS})
    controller = ThreadpoolController()
    before = {lib.filepath: lib.num_threads for lib in controller.lib_controllers}
    controller.limit(limits=count)

    def restore():
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        for lib in ThreadpoolController().lib_controllers:
            lib.set_num_threads(before.get(lib.filepath, usable_cores()))

    return restore


def jax_by_default():
    """Whether CPU ranks compile a function that names no ``mode`` with JAX: JAX
    is installed, PyTensor's mode is its default (no ``mode`` in its flags), and
    this process can run JAX (``forked_after_jax``).  JAX compiles in seconds
    where Numba takes tens of seconds on an empty cache, and its compiled steps
    are as fast or faster (see the docs page "CPU workers")."""
    import pytensor

    return (str(pytensor.config.mode) == "Mode" and importlib.util.find_spec("jax") is not None
            and not forked_after_jax())


_FORK_STATE = {"after_jax": False}


def jax_started(if_unknown):
    """Whether JAX has started a backend (and its threads) in this process;
    ``if_unknown`` where a JAX whose internals moved cannot tell (the caller's
    safe side)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge._backends)
    except Exception:
        return if_unknown


def _note_fork():
    _FORK_STATE["after_jax"] = _FORK_STATE["after_jax"] or jax_started(if_unknown=True)


os.register_at_fork(after_in_child=_note_fork)


def forked_after_jax():
    """Whether this process was forked (``os.fork``) from one where JAX had
    started: JAX's threads did not come along, and its next compile waits for
    them forever.  A session started in such a child (say, a chain process that
    leaves its parent's session) compiles with PyTensor's default linker."""
    return _FORK_STATE["after_jax"]


def _use_jax_cache():
    """JAX's persistent compilation cache beside PyTensor's, unless the user set one."""
    import jax
    import pytensor

    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(pytensor.config.compiledir, "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def core_share(index, threads, ranks=None):
    """The cores (of those this process may use) of the JAX pool of the rank at
    ``index`` among its host's ranks, or None when ``threads`` is None.

    With ``ranks`` (the share came from the rule, not the user), each rank gets
    its stretch of the cores, ``ceil(cores / ranks)`` long: where the ranks do
    not divide the cores (9 on 16), neighbours share a core instead of leaving
    cores idle, and the step is no longer as slow as one core.  (Under a CPU
    limit, ``cores`` counts what the limit allows: ``usable_cores``.)
    Otherwise the user's ``threads`` cores, rank after rank."""
    if threads is None or not hasattr(os, "sched_getaffinity"):
        return None
    usable = sorted(os.sched_getaffinity(0))
    n = len(usable)
    if ranks is None:
        k = min(threads, n)
        start = index * k % n
    else:
        k, start = min(-(-usable_cores() // ranks), n), (index % ranks) * n // ranks
    return tuple(usable[(start + j) % n] for j in range(k))


def worker_jax_cores(config, cluster):
    """The cores of a worker's JAX pool (``core_share``), from its start-up
    ``config``: by its place among its host's ranks."""
    chosen = config.get("threads")  # fork()'s ``threads``, the user's choice
    if cluster is None:  # spawned on the master's host, which chose the share
        return core_share(config["rank"], config.get("thread_share"),
                          None if chosen is not None else config["n_parallel"])
    here = cluster.ranks_on_my_node(config["n_parallel"])
    return core_share(cluster.node_index, thread_share(here, chosen), None if chosen is not None else here)


def start_jax_pool(cores, cpu_only=False):
    """Start JAX's CPU backend with its thread pool on ``cores`` only.

    XLA sizes that pool, once, by the cores the process may use, and its threads
    keep the cores they were created on.  With every rank's pool on every core,
    the ranks' threads would crowd the same cores and slow small steps several
    times over (see the docs page "CPU workers"); this process itself keeps all
    its cores.  ``cpu_only`` (a CPU worker): JAX starts no other backend, unless
    the user chose its platforms (``JAX_PLATFORMS``): with JAX's CUDA plugin
    installed, every CPU worker would start a GPU backend too, taking GPU
    memory, or failing where a GPU admits one process (exclusive compute mode).
    Returns whether it started the backend: not when ``cores`` is None or the
    backend already runs."""
    try:  # JAX has no public question for this; without it, leave the backend be
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:
        return False
    if backends_are_initialized():
        return False
    import jax

    if cpu_only and not os.environ.get("JAX_PLATFORMS") and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    if cores is None:
        return False
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        cpu = jax.devices("cpu")[0]
        jax.device_put(0, cpu).block_until_ready()  # a computation: the pool's threads exist
    finally:
        os.sched_setaffinity(0, everything)
    return True


def thread_pools():
    """``(library, threads)`` of each BLAS and OpenMP pool loaded in this process."""
    from threadpoolctl import threadpool_info

    return sorted((info["internal_api"], info["num_threads"]) for info in threadpool_info())


class CpuDevice(Device):
    """Device layer for CPU worker processes: a call's work is done when its
    reply comes; function outputs are reduced in the master; collectives go
    through shared memory.  ``precision`` 'tf32' computes in full float32 too;
    'bf16' is emulated (``synkhronos._graph.bf16``)."""

    name = "cpu"
    label = "CPU cores"
    threads = None  # each rank's BLAS and OpenMP threads; None: as the user's environment says
    thread_choice = None  # fork()'s ``threads``
    jax_cores = None  # the cores of this rank's JAX thread pool (see start_jax_pool)
    _restore_threads = None  # undoes the master's thread limits at close
    _jax_default_device = None  # what this session made JAX's default device (_jax_on_cpu)
    jax_default = False  # functions that name no mode compile with JAX (jax_by_default)
    worker = False  # a worker's device: its JAX starts the CPU backend only (start_jax_pool)

    @property
    def status(self):
        """What the status line of ``fork()`` says about this device's numerics."""
        if self.precision == "bf16":
            return "bf16 matrix products and convolutions emulated with numpy (slow)"
        if not self.jax_default:
            return ""
        import pytensor

        if pytensor.config.floatX == "float64":
            return "functions compile with JAX (floatX float64: float64 graphs run in float64)"
        return ("functions compile with JAX (floatX float32: float64 and int64 values are kept in "
                "32 bits; mode=\"NUMBA\" keeps them)")

    def available(self):
        return usable_cores()

    def configure_jax(self):
        """Whether JAX is the default linker here (``jax_by_default``); and JAX
        follows PyTensor's rule, its 64-bit mode on when ``floatX`` is float64.
        PyTensor applies the rule when its JAX backend is first imported (JAX
        itself is imported no sooner: it takes a second or more); if that
        happened before ``fork()`` settled ``floatX`` (say, an extension
        registering JAX implementations was imported first), apply it again now."""
        self.jax_default = jax_by_default()
        if forked_after_jax():
            logger.info("CPU ranks compile with PyTensor's default linker, not JAX: this process was "
                        "forked after JAX started here, and JAX's first compile would wait forever")
        if "pytensor.link.jax.dispatch.basic" in sys.modules:
            import jax
            import pytensor

            jax.config.update("jax_enable_x64", pytensor.config.floatX == "float64")

    def function_kwargs(self, kwargs):
        """Compile with JAX where it is the default linker and the call names no mode."""
        if self.jax_default and "mode" not in kwargs:
            return dict(kwargs, mode="JAX")
        return kwargs

    @staticmethod
    def after_updates(core):
        """A JAX function leaves JAX arrays in the shared variables it updates;
        they become numpy arrays again (a copy), which every linker reads, and the
        user's own functions in the master: Numba cannot read a JAX array."""
        if core.index_only:  # a JAX-mode function
            for var, _ in core.updates:
                storage = var.container.storage
                if not isinstance(storage[0], np.ndarray) and type(storage[0]).__module__.startswith("jax"):
                    storage[0] = aligned_copy(storage[0])

    def share_threads(self, ranks_here, threads=None, index=0):
        """Give this process, and the workers it spawns, their share of the
        threads (``thread_share``); the master's pools are set now, with
        threadpoolctl, and restored by ``close()``.  ``index``: this process's
        place among the ``ranks_here`` ranks of its host, which picks the cores
        of its JAX pool."""
        self.thread_choice = threads  # what ranks launched by MPI apply on their own hosts
        self.threads = thread_share(ranks_here, threads)
        self._restore_threads = limit_threads(self.threads)
        self.jax_cores = core_share(index, self.threads, None if threads is not None else ranks_here)

    def start_jax_pool(self):
        """Start JAX's CPU backend on this rank's share of the cores (before
        this rank's first JAX function); where JAX is the default linker, with its
        persistent cache, so that later runs load the compiled code."""
        if self.jax_default:
            _use_jax_cache()
        start_jax_pool(self.jax_cores, cpu_only=self.worker)
        self._jax_on_cpu()

    def _jax_on_cpu(self):
        """Make the CPU JAX's default device while the session lasts, unless the
        user chose one (``jax_default_device``).  Where JAX also has a GPU (its
        CUDA plugin installed), its default device is the GPU: the master's share
        of every call would be computed there, float32 products in TF32, while
        the workers compute on their cores.  ``close()`` gives the default back."""
        import jax

        if jax.config.jax_default_device is not None:  # the user's, or set already
            return
        try:  # a platform's name: JAX's backends need not start for it
            jax.config.update("jax_default_device", "cpu")
        except (TypeError, ValueError):
            jax.config.update("jax_default_device", jax.devices("cpu")[0])
        self._jax_default_device = jax.config.jax_default_device

    def worker_env(self, rank, n_parallel):
        """Environment of worker ``rank``: its share of the threads, read by
        BLAS and OpenMP as they load (nothing when the user's environment chose)."""
        return {} if self.threads is None else {v: str(self.threads) for v in THREAD_VARS}

    def setup_master(self, rank):
        """Nothing to set up (threads: ``share_threads``)."""

    def close(self, abort=False):
        """Give the master's thread pools back their sizes from before ``fork()``,
        and JAX its default device."""
        restore, self._restore_threads = self._restore_threads, None
        if restore is not None:
            restore()
        ours, self._jax_default_device = self._jax_default_device, None
        if ours is not None:
            import jax

            if jax.config.jax_default_device is ours:  # (not if the user changed it since)
                jax.config.update("jax_default_device", None)

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
        var.set_value(aligned_copy(value, var.dtype), borrow=True)  # JAX reads it in place
