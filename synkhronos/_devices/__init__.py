"""Device layers: how a rank runs functions and holds shared values.

``_base.Device`` lists what every layer provides; ``cpu`` runs PyTensor's default
CPU linker in one process per worker, ``cpu_mpi`` adds MPI collectives for CPU
ranks of an MPI launch, ``gpu`` runs one process per GPU (JAX, NCCL).
``select_device`` is the one place that chooses among them.
"""

from ._base import Device

__all__ = ["Device", "select_device", "visible_gpus"]


def visible_gpus():
    """Identifiers of the GPUs this process may use, without starting CUDA
    (see ``gpu.visible_gpus``); [] when JAX or CuPy is missing."""
    from . import gpu

    return gpu.visible_gpus() if gpu.gpu_stack_available() else []


def select_device(use_gpu, precision=None, cluster=None, n_parallel=None, worker=False):
    """The device layer of this process.

    Parameters
    ----------
    use_gpu : bool or None
        None: GPUs if there are any (and JAX and CuPy are installed), else CPU
        workers; False: CPU workers; True: GPUs, or RuntimeError.  In a worker,
        whether the master chose GPUs.
    precision : str, optional
        As for ``fork``; None in a worker (it follows the master's).
    cluster : synkhronos._session.mpi.Cluster, optional
        The ranks of an MPI launch: CPU ranks then run collectives over MPI.
    n_parallel : int, optional
        The session's ranks (with ``cluster``: whether they share one node).
    worker : bool
        Whether this process is a worker (its GPU was chosen by the master).
    """
    from . import cpu

    if worker:
        return _worker_device(use_gpu, cluster)
    precision = precision or "highest"
    device = cpu.CpuDevice(precision) if use_gpu is False else _gpu_or_cpu(use_gpu, precision)
    if cluster is None:
        return device
    if device.name == "cpu":  # collectives by MPI
        from .cpu_mpi import MpiCpuDevice

        return MpiCpuDevice(lambda: cluster.comm, precision)
    device.one_node = cluster.one_node(n_parallel)
    return device


def _gpu_or_cpu(use_gpu, precision):
    from . import cpu, gpu

    stack = gpu.gpu_stack_available()
    ids = gpu.visible_gpus() if stack or use_gpu else []
    if stack and ids:
        return gpu.GpuDevice(ids, precision)
    if use_gpu is None:
        return cpu.CpuDevice(precision)
    why = "no GPU was found" if not ids else "JAX and CuPy are not installed (pip install synkhronos[gpu])"
    raise RuntimeError("use_gpu=True but %s; use synkhronos.fork(use_gpu=False) for CPU workers" % why)


def _worker_device(use_gpu, cluster):
    if use_gpu:
        from . import gpu

        return gpu.GpuDevice(gpu_ids=[])
    if cluster is not None:
        from . import cpu_mpi

        device = cpu_mpi.MpiCpuDevice(lambda: cluster.comm)
    else:
        from . import cpu

        device = cpu.CpuDevice()
    device.worker = True
    return device
