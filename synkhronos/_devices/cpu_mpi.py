"""CPU workers on several hosts, launched by ``mpirun``: functions run as on
``CpuDevice``; collectives on shared variables are MPI collectives on numpy
buffers (nothing pickled): the device collectives of ``_base.Device``.

Each call posts one nonblocking collective per variable, in the same order on
every rank (as MPI requires), then waits once.  A rank whose value differs from
the shape the master gave takes part with a zero stand-in, so no rank waits
forever, and raises after.  mpi4py is imported on use: importing Synkhronos
must not start MPI.
"""

import numpy as np

from .._common.aligned import ALIGNMENT, aligned_copy, aligned_empty
from .._common.reduce import truncated_divide
from .._common.waiting import wait_requests
from .cpu import CpuDevice

__all__ = ["MpiCpuDevice"]

# numpy's reductions of bools are logical (np.add is "or", np.multiply "and"), and
# MPI reduces C_BOOL only with the logical operations.  avg: the "or", divided by
# n and cast back to bool, is the "or" again, as the shared-memory path gives.
_BOOL_OPS = {"avg": "LOR", "sum": "LOR", "max": "LOR", "prod": "LAND", "min": "LAND"}
_MPI_OPS = {"avg": "SUM", "sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN"}
_TYPES = {}  # numpy dtype -> MPI datatype, filled on use


def _mpi_type(dtype):
    """MPI's datatype for numpy ``dtype`` (bool: C_BOOL; float16: SHORT_FLOAT,
    where the library has it); TypeError where MPI has none."""
    try:
        return _TYPES[dtype]
    except KeyError:
        pass
    from mpi4py import MPI

    dt = np.dtype(dtype)
    mpi_type = MPI.DATATYPE_NULL
    if dt.kind in "biufc" and dt.isnative:  # not datetimes, strings or objects
        try:
            mpi_type = MPI.Datatype.fromcode(dt.char)  # mpi4py's numpy typecode table
        except (ValueError, KeyError):
            pass
    if mpi_type == MPI.DATATYPE_NULL:
        raise TypeError("MPI has no data type for %s" % dt)
    _TYPES[dtype] = mpi_type
    return mpi_type


def _average(total, n, dtype):
    """A sum over ``n`` ranks divided by ``n`` in ``dtype``: integers truncated
    exactly (``truncated_divide``), booleans (an "or") as they are."""
    kind = np.dtype(dtype).kind
    if kind in "iu":  # (a widened sum wraps around into dtype first)
        return truncated_divide(total.astype(dtype, copy=False), n)
    if kind == "b":
        return total
    if total.dtype == dtype:  # in place: the buffer stays aligned (see ``MpiCpuDevice._take``)
        return np.true_divide(total, n, out=total)
    return np.asarray(total / n).astype(dtype)


class MpiCpuDevice(CpuDevice):
    """Device layer for CPU worker processes joined by MPI (see module docstring).

    Parameters
    ----------
    comm_factory : callable, optional
        Returns the mpi4py communicator to use (default ``MPI.COMM_WORLD``);
        called once, in ``init_comm``.
    precision : str
        As for ``CpuDevice``.
    """

    has_collectives = True  # collectives run over MPI; their results are in place when they return

    def __init__(self, comm_factory=None, precision="highest"):
        super().__init__(precision=precision)
        self._comm_factory = comm_factory
        self._comm = None
        self.n_parallel = None
        self.rank = None

    @staticmethod
    def new_uid():
        """MPI needs no rendezvous token: ``mpirun`` has joined the ranks."""
        return None

    def init_comm(self, n_parallel, rank, uid):
        """Take the factory's communicator (``uid`` is unused).

        Raises
        ------
        RuntimeError
            If its size or rank is not ``n_parallel`` or ``rank``.
        """
        if self._comm_factory is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        else:
            comm = self._comm_factory()
        size, mine = comm.Get_size(), comm.Get_rank()
        if size != n_parallel or mine != rank:
            raise RuntimeError("MPI communicator has size %d and rank %d, but the runtime expects "
                               "n_parallel=%d and rank=%d" % (size, mine, n_parallel, rank))
        self.n_parallel, self.rank = n_parallel, rank
        self._comm = comm

    def numpy_interface(self, shareds, on_set, before_get):
        """Nothing to wrap: shared values are numpy already."""

    def close(self, abort=False):
        """Drop the communicator; it belongs to ``mpirun``'s world (or to the
        factory's owner), so it is not freed here."""
        self._comm = None
        super().close(abort)

    def synchronize(self, shareds):
        """Nothing is left running: every collective waits before it returns."""

    # ------------------------------------------------------------ collectives
    @classmethod
    def check_collective(cls, variables, op=None):
        """Check, before any rank starts, that MPI can move every variable (and
        reduce it under ``op``, for reductions).

        Raises
        ------
        TypeError
            Naming the first variable whose dtype MPI has no datatype (or no
            ``op``) for.
        """
        for var in variables:
            dtype = getattr(var, "dtype", None)
            if dtype is None:
                raise TypeError("%s is not an array variable; MPI cannot move it" % (var,))
            try:
                _mpi_type(dtype)
                if op is not None:
                    cls._op(op, dtype)
            except TypeError as exc:
                raise TypeError("%s has dtype %s: %s" % (var, dtype, exc)) from None

    def _wait(self, requests):
        """Wait for MPI ``requests``; the master keeps checking the workers'
        replies meanwhile (``wait_hook``), so a worker's failure does not hang it."""
        wait_requests(requests, self.wait_hook)

    @staticmethod
    def _raise(problems):
        if problems:
            raise ValueError("; ".join(problems))

    def _input(self, var, shape, problems):
        """(``var``'s value as a contiguous send buffer, whether it is the real
        value or a zero stand-in of the expected ``shape`` and dtype)."""
        value = self.get_value(var)
        shape = tuple(shape)
        if value.shape != shape or value.dtype != np.dtype(var.dtype):
            problems.append("%s has shape %s and dtype %s on rank %d but the master expected %s and %s"
                            % (var, value.shape, value.dtype, self.rank, shape, var.dtype))
            return np.zeros(shape, dtype=var.dtype), False
        return np.asarray(value, order="C"), True  # (np.ascontiguousarray makes 0-d 1-d)

    @staticmethod
    def _op(op, dtype):
        """MPI's reduce operation for ``op`` on ``dtype``; TypeError for max or
        min of complex values, which MPI does not define."""
        from mpi4py import MPI

        kind = np.dtype(dtype).kind
        if kind == "b":
            return getattr(MPI, _BOOL_OPS[op])
        if kind == "c" and op in ("max", "min"):
            raise TypeError("MPI has no %s of complex values (dtype %s)" % (op, dtype))
        return getattr(MPI, _MPI_OPS[op])

    @staticmethod
    def _take(var, fresh):
        """Make ``fresh`` (a new array of ``var``'s dtype that nothing else holds,
        aligned as ``aligned_empty`` makes it) ``var``'s value without the copy
        ``set_value`` makes, which a large value would pay on every collective.
        Where it is not aligned after all, it is copied once, as JAX would
        copy it on every call otherwise."""
        if fresh.nbytes and fresh.ctypes.data % ALIGNMENT:
            fresh = aligned_copy(fresh)
        var.set_value(fresh, borrow=True)

    def _reduce(self, variables, op, shapes, root):
        """Post a reduction of each variable (into ``root``, or all ranks when
        None) and wait; returns [(var, result or None, real)] and the problems."""
        ops = [self._op(op, var.dtype) for var in variables]  # raise before any rank posts
        problems, requests, outputs = [], [], []
        for var, shape, mpi_op in zip(variables, shapes, ops):
            x, real = self._input(var, shape, problems)
            if op in ("sum", "avg") and x.dtype.kind in "iu" and x.dtype.itemsize < 4:
                # Open MPI's vectorized sums of 8- and 16-bit integers saturate (its
                # scalar loop, for short arrays, wraps around): add 64-bit copies, so
                # that the result wraps as numpy's and NCCL's do, whatever the length.
                x = x.astype(np.int64 if x.dtype.kind == "i" else np.uint64)
            dt = _mpi_type(x.dtype)
            out = aligned_empty(x.shape, x.dtype) if root in (None, self.rank) else None
            if root is None:
                requests.append(self._comm.Iallreduce([x, dt], [out, dt], op=mpi_op))
            else:
                spec = None if out is None else [out, dt]
                requests.append(self._comm.Ireduce([x, dt], spec, op=mpi_op, root=root))
            outputs.append((var, x, out, real))  # x stays alive until the wait
        self._wait(requests)
        if root in (None, self.rank):
            # avg: the sum divided by n, cast back (integers truncated), as
            # ``reduce_values`` and the shared-memory path give it; a widened sum
            # wraps around into the variable's dtype.
            outputs = [(var, x, _average(out, self.n_parallel, var.dtype) if op == "avg" else
                        out.astype(var.dtype, copy=False), real) for var, x, out, real in outputs]
        return [(var, out, real) for var, _, out, real in outputs], problems

    def all_reduce(self, variables, op, shapes):
        """Every rank's variables become their reduction under ``op`` over all ranks.

        Parameters
        ----------
        variables : list of SharedVariable
        op : {"avg", "sum", "prod", "max", "min"}
        shapes : list of tuple
            Each variable's shape on every rank, as the master checked.

        Raises
        ------
        ValueError
            If this rank's value of a variable differs in shape or dtype (that
            variable is left as it was; the others are set).
        TypeError
            For max or min of complex values (on every rank, before any posts).
        """
        results, problems = self._reduce(variables, op, shapes, None)
        for var, result, real in results:
            if real:
                self._take(var, result)
        self._raise(problems)

    def reduce(self, variables, op, root, in_place, shapes):
        """Reduce into ``root`` (see ``all_reduce``).

        Returns
        -------
        list of ndarray
            On ``root`` without ``in_place``, the results; otherwise [] (on
            ``root`` with ``in_place`` the variables are set instead).
        """
        results, problems = self._reduce(variables, op, shapes, root)
        if self.rank == root and in_place:
            for var, result, real in results:
                if real:
                    self._take(var, result)
        self._raise(problems)
        return [r for _, r, _ in results] if self.rank == root and not in_place else []

    def broadcast(self, variables, root, shapes):
        """Every rank takes ``root``'s values (of ``shapes``); ValueError on
        ``root`` if its own value differs (the others then receive zeros)."""
        problems, requests, bufs = [], [], []
        for var, shape in zip(variables, shapes):
            if self.rank == root:
                buf, _ = self._input(var, shape, problems)
            else:
                buf = aligned_empty(shape, var.dtype)
            requests.append(self._comm.Ibcast([buf, _mpi_type(var.dtype)], root=root))
            bufs.append(buf)  # the root's too stays alive until the wait
        self._wait(requests)
        if self.rank != root:
            for var, buf in zip(variables, bufs):
                self._take(var, buf)
        self._raise(problems)

    def _gatherv(self, variables, shapes, root):
        """Post a gather of each variable (``shapes[k][rank]`` elements from each
        rank, into ``root``, or all ranks when None) and wait; returns
        [(var, list of the ranks' arrays or None, real)] and the problems."""
        problems, requests, outputs = [], [], []
        for var, per_rank in zip(variables, shapes):
            per_rank = [tuple(s) for s in per_rank]
            x, real = self._input(var, per_rank[self.rank], problems)
            dt = _mpi_type(var.dtype)
            counts = [int(np.prod(s, dtype=np.int64)) for s in per_rank]
            displs = [int(d) for d in np.cumsum([0] + counts[:-1])]
            recv = np.empty(sum(counts), dtype=var.dtype) if root in (None, self.rank) else None
            spec = None if recv is None else [recv, counts, displs, dt]
            if root is None:
                requests.append(self._comm.Iallgatherv([x, dt], spec))
            else:
                requests.append(self._comm.Igatherv([x, dt], spec, root=root))
            parts = None if recv is None else [recv[d:d + c].reshape(s)
                                               for s, c, d in zip(per_rank, counts, displs)]
            outputs.append((var, x, parts, real))  # views: filled by the wait
        self._wait(requests)
        return [(var, parts, real) for var, _, parts, real in outputs], problems

    def gather(self, variables, root, shapes):
        """Gather every rank's value into ``root``; ValueError as ``all_reduce``.

        Parameters
        ----------
        shapes : list of list of tuple
            ``shapes[k][r]``: the shape of variable ``k`` on rank ``r``.

        Returns
        -------
        list of list of ndarray
            On ``root``, per variable, the ranks' values in rank order; [] elsewhere.
        """
        results, problems = self._gatherv(variables, shapes, root)
        self._raise(problems)
        return [parts for _, parts, _ in results] if self.rank == root else []

    def all_gather(self, variables, shapes):
        """Every rank's value becomes the concatenation (axis 0) of all ranks'
        values, in rank order (see ``gather``; on a ValueError here the
        other variables are still set)."""
        results, problems = self._gatherv(variables, shapes, None)
        for var, parts, real in results:
            if real:
                joined = aligned_empty((sum(len(p) for p in parts),) + parts[0].shape[1:], var.dtype)
                self._take(var, np.concatenate(parts, out=joined))
        self._raise(problems)
