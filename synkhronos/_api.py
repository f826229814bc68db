"""Starting and stopping Synkhronos: ``fork``, ``distribute``, ``close``, and
the order things end at exit: the session closes first (its workers leave their
loops), then, under an MPI launch, ranks still waiting for a session are
released and MPI is finalized (not after a failure: a dead rank would never
join MPI's finalize)."""

import atexit
import functools
import logging
import math
import numbers
import threading
import time
import warnings

from ._devices import select_device
from ._session import mpi, runtime
from ._wire.protocol import Sync

__all__ = ["fork", "distribute", "close", "synchronize", "n_parallel", "device_kind", "gpus", "mpi_launched"]

logger = logging.getLogger(__name__)


def _check_int(value, argname, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an int, got %r" % (argname, value))
    if value < low:
        raise ValueError("%s must be >= %d, got %d" % (argname, low, value))
    return int(value)


_PRECISIONS = ("highest", "tf32", "bf16")
DEFAULT_TIMEOUT = 300.0


def _check_timeout(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError("timeout must be a number of seconds or None, got %r" % (timeout,))
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError("timeout must be a positive, finite number of seconds or None (no limit), "
                         "got %r" % (timeout,))
    return float(timeout)


_FORK_LOCK = threading.Lock()


def _one_at_a_time(fn):
    """Two threads forking at once: one starts the session, the other is told
    it is already forked."""

    @functools.wraps(fn)
    def serialized(*args, **kwargs):
        with _FORK_LOCK:
            return fn(*args, **kwargs)

    return serialized


@_one_at_a_time
def fork(n_parallel=None, use_gpu=None, master_rank=0, profile_workers=False,
         max_n_var=None, max_dim=None, precision="highest", timeout=DEFAULT_TIMEOUT, threads=None):
    """Start the worker processes.  Call before building Synkhronos functions.

    Parameters
    ----------
    n_parallel : int, optional
        Number of ranks, the master included; default: every visible GPU, or
        every usable CPU core, as many as a CPU limit allows (under MPI: every
        MPI rank).
    use_gpu : bool or None, optional
        None (default): GPUs when there are any, else CPU workers.  False: CPU
        workers.  True: GPUs, or an error if there are none.
    master_rank : int, optional
        Rank of the master process (on GPUs: which GPU the master drives).
    profile_workers : bool, optional
        Record a cProfile of each worker, written to the temp directory on close.
    max_n_var, max_dim : int, optional
        Accepted for 2017 scripts and checked, with a warning that they do nothing.
    precision : {'highest', 'tf32', 'bf16'}, optional
        How float32 matrix products and convolutions are computed: in full
        float32 (default), in TensorFloat-32 on GPU ranks, or in bf16 mixed
        precision in Synkhronos functions (docs pages "GPU workers", "Deep learning").
    timeout : float or None, optional
        Seconds any rank may take to answer a request before the master raises
        ``StallError`` and closes the session (default 300; None: no limit).  See
        the docs page "Errors, faults and cleanup".
    threads : int, optional
        BLAS, OpenMP and JAX threads for each CPU rank; default: its share of its
        host's cores, unless a variable such as ``OMP_NUM_THREADS`` is set.  GPU
        ranks ignore it.  See the docs page "CPU workers".

    Returns
    -------
    int
        Number of ranks.

    Raises
    ------
    RuntimeError
        If already forked, or ``use_gpu=True`` and no GPU can be used, or
        under MPI when this launch already had its session.
    TypeError, ValueError
        For malformed arguments.

    Notes
    -----
    ``floatX`` stays as you set it, on every rank (docs pages "CPU workers",
    "GPU workers").  Under an MPI launch every rank runs the script: MPI rank 0
    returns from ``fork`` as the master, every other rank serves it inside
    ``fork`` and ends its process when the master closes (docs page "Several
    machines").  Status lines go to the ``synkhronos`` logger (docs page
    "Troubleshooting").
    """
    if runtime.current() is not None:
        raise RuntimeError("Synkhronos is already forked: call synkhronos.close() before forking again")
    timeout = _check_fork_args(use_gpu, profile_workers, max_n_var, max_dim, precision, timeout)
    threads = None if threads is None else _check_int(threads, "threads", 1)
    if mpi.launched():
        return _fork_mpi(n_parallel, use_gpu, master_rank, profile_workers, precision, timeout, threads)
    device = select_device(use_gpu, precision)
    available = device.available()
    n = available if n_parallel is None else _check_int(n_parallel, "n_parallel", 1)
    master_rank = _check_int(master_rank, "master_rank", 0)
    if master_rank >= n:
        raise ValueError("master_rank must be < n_parallel=%d, got %d" % (n, master_rank))
    if device.name == "gpu" and n > available:
        raise ValueError("n_parallel=%d but only %d GPUs are visible" % (n, available))
    device.setup_master(master_rank)
    if device.name == "cpu":
        device.share_threads(n, threads, master_rank)
    device.configure_jax()
    logger.info("Synkhronos attempting to use %d of %d detected %s...", n, available, device.label)
    t0 = time.monotonic()
    runtime.start(n, master_rank, device, bool(profile_workers), timeout)
    logger.info("Synkhronos: %d %s initialized, master rank: %d%s",
                n, "CPU workers" if device.name == "cpu" else "GPUs", master_rank,
                ", " + device.status if device.status else "")
    logger.debug("fork: %d ranks started in %.2f s", n, time.monotonic() - t0)
    return n


def _check_fork_args(use_gpu, profile_workers, max_n_var, max_dim, precision, timeout):
    """Raise TypeError or ValueError for a malformed ``fork`` argument; returns
    the timeout as a float or None."""
    if use_gpu is not None and not isinstance(use_gpu, bool):
        raise TypeError("use_gpu must be None, True or False, got %r" % (use_gpu,))
    if not isinstance(profile_workers, bool):
        raise TypeError("profile_workers must be True or False, got %r" % (profile_workers,))
    dead = (("max_n_var", max_n_var), ("max_dim", max_dim))  # the 2017 API's, which nothing needs now
    given = {name: value for name, value in dead if value is not None}
    for name, value in given.items():
        _check_int(value, name, 1)
    if given:
        warnings.warn("fork(): %s do%s nothing (nothing here needs fixed sizes); accepted for 2017 scripts"
                      % (" and ".join(given), "" if len(given) > 1 else "es"), UserWarning, stacklevel=4)
    if not isinstance(precision, str) or precision not in _PRECISIONS:
        raise ValueError("precision must be 'highest' (full float32), 'tf32' or 'bf16', got %r"
                         % (precision,))
    return _check_timeout(timeout)


def _fork_mpi(n_parallel, use_gpu, master_rank, profile_workers, precision, timeout, threads):
    """``fork()`` in a process of an MPI launch (see ``synkhronos._session.mpi``): rank 0
    becomes the master; every other rank serves it and ends its process."""
    cluster = mpi.cluster()
    if cluster.rank != 0:
        from ._session.worker import mpi_main

        mpi_main(cluster)  # never returns
    mpi.check_unused()
    if not _launch_end["registered"]:
        atexit.register(_end_mpi_launch, cluster)
        _launch_end["registered"] = True
    n = cluster.world.Get_size()
    if n_parallel is not None:
        if _check_int(n_parallel, "n_parallel", 1) > n:
            raise ValueError("n_parallel must be at most the number of MPI ranks (%d) under an MPI launch, "
                             "got %d" % (n, n_parallel))
        n = n_parallel  # the other ranks wait for the end
    if _check_int(master_rank, "master_rank", 0) != 0:
        raise ValueError("master_rank must be 0 under an MPI launch (the master is MPI rank 0), got %d"
                         % master_rank)
    device = select_device(use_gpu, precision, cluster, n)
    hosts = cluster.hosts_of_first(n)
    logger.info("Synkhronos attempting to use %d MPI ranks on %d host%s (%s)...", n, hosts,
                "s" if hosts > 1 else "", device.label)
    device.setup_master(0)
    if device.name == "cpu":
        device.share_threads(cluster.ranks_on_my_node(n), threads, cluster.node_index)
    device.configure_jax()
    mpi.start_session()
    _launch_end["session"] = runtime.start(n, 0, device, bool(profile_workers), timeout, cluster)
    logger.info("Synkhronos: %d %s initialized on %d host%s, master rank: 0%s", n,
                "CPU workers" if device.name == "cpu" else "GPUs", hosts, "s" if hosts > 1 else "",
                ", " + device.status if device.status else "")
    return n


@runtime.action("distribute()")
def distribute():
    """Replicate the Synkhronos functions built so far, and their shared
    variables, in the workers.  Call after building functions and before
    calling them.

    Each call sends only what was built since the last one, so functions can be
    added later (``synkhronos.pymc.data_parallel`` does so by itself): build,
    ``distribute()`` again, call.  A shared variable stays one variable in each
    worker, whichever functions use it and whenever they were distributed.
    Sending all functions in one call lets the ranks share out their compiles.

    Raises
    ------
    RuntimeError
        If not forked.
    TypeError
        If a function cannot be pickled (an Op holding a lock, say; what the
        standard pickler cannot copy goes by cloudpickle).  The error names the
        function and its Op.  Every other function is distributed; the refused
        one raises the same error when called.
    WorkerError
        If a worker could not load the functions (say, a custom Op whose
        module it cannot import).  The session is closed then, since its ranks
        no longer hold the same functions.
    """
    rt = runtime.require()
    if rt.distributed and not any(rt.registry.undistributed()):
        return
    logger.info("Synkhronos distributing functions...")
    t0 = time.monotonic()
    rt.distribute()
    logger.info("...distribution complete (%.0f s).", time.monotonic() - t0)


def close():
    """Stop the workers and release all shared memory.  Idempotent; also runs
    at exit.  After ``close()``, ``fork()`` may start a new session."""
    runtime.shutdown()


@runtime.action("synchronize()")
def synchronize():
    """Wait until every rank has finished all the work queued on its device.

    Function calls that return outputs already wait for their results, and
    anything that reads a shared variable waits for the work that writes it, so
    this is needed only to time device work or to hand the GPUs to other code.
    Device collectives (``all_reduce`` etc. on GPUs) return once queued; a
    failure inside one on a worker is raised here at the latest.

    Raises
    ------
    RuntimeError
        If not forked, or closed.
    WorkerError
        If a worker failed, now or in a collective queued earlier.
    """
    rt = runtime.require()
    rt.dispatcher.request(Sync(), local=lambda: rt.device.synchronize(rt.registry.shareds))


def n_parallel():
    """Number of ranks of the live session (the master is one of them).

    Raises
    ------
    RuntimeError
        If not forked.
    """
    return runtime.require().n_parallel


def device_kind():
    """What the ranks of the live session run on: ``"gpu"`` or ``"cpu"``.

    Raises
    ------
    RuntimeError
        If not forked.
    """
    return runtime.require().device.name


def gpus():
    """The GPUs of the live session, one identifier (as ``CUDA_VISIBLE_DEVICES``
    names it) per rank in rank order, or ``[]`` for CPU workers.  Before
    ``fork()``: the GPUs ``fork()`` would use (those visible, when JAX and CuPy
    are installed), so a script can choose ``n_parallel`` from their number.
    Under an MPI launch, this host's."""
    from ._devices import visible_gpus

    rt = runtime.current()
    if rt is None or rt.foreign:
        return visible_gpus()
    if rt.device.name != "gpu":
        return []
    return list(rt.device.gpu_ids[:rt.n_parallel]) if rt.cluster is None else visible_gpus()


def mpi_launched():
    """Whether this process is one rank of several that an MPI launcher started
    (``mpirun``, ``srun``, ...; ``SYNKHRONOS_MPI=0`` says no).  Then every rank
    runs the script and only rank 0 returns from ``fork()`` (see "Several
    machines" in the docs)."""
    return mpi.launched()


# The MPI launch this process is rank 0 of: whether its end is registered, and its session.
_launch_end = {"registered": False, "session": None}


def _end_mpi_launch(cluster):
    """At the master's exit under MPI: close the session, release ranks still
    waiting for one, and finalize MPI with them, unless the session failed."""
    runtime.shutdown()  # workers leave their loops before the master's finalize, which waits for them
    session = _launch_end["session"]
    if session is None:
        mpi.refuse_workers(cluster)
    if session is None or not session.failed:
        mpi.finalize()


atexit.register(runtime.shutdown)  # runs after _end_mpi_launch, registered later
