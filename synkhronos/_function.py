"""``synk.function()``: PyTensor functions that run data-parallel on all ranks."""

import logging
import numbers
import os
import time

import numpy as np

from . import _log, _runtime
from ._core import FunctionCore, compile_function, is_jax_mode
from ._data import Data, make_data
from ._exchange import receive
from ._plan import (
    brief,
    check_selection_fits,
    normalize_batch,
    normalize_batch_s,
    selection_length,
    split_bounds,
    sub_selection,
)
from ._protocol import Command
from ._reduce import check_op, reduce_values

__all__ = ["function", "Function"]

logger = logging.getLogger(__name__)


def _is_variable(v):
    from pytensor.graph.basic import Variable

    return isinstance(v, Variable)


def _is_shared(v):
    from pytensor.compile.sharedvalue import SharedVariable

    return isinstance(v, SharedVariable)


def _as_var_list(value, argname):
    if value is None:
        return []
    if _is_variable(value):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(_is_variable(v) for v in value):
        raise TypeError("%s must be a list of PyTensor variables, got %r" % (argname, value))
    return list(value)


def _parse_outputs(outputs):
    """Returns (variables, modes, single) from the ``outputs`` argument."""
    if outputs is None:
        return [], [], False
    if _is_variable(outputs):
        return [outputs], ["avg"], True
    if isinstance(outputs, tuple) and len(outputs) == 2 and _is_variable(outputs[0]) \
            and not _is_variable(outputs[1]):
        return [outputs[0]], [check_op(outputs[1], "output reduce operation")], True
    if not isinstance(outputs, (list, tuple)):
        raise TypeError("outputs must be a variable, a (variable, op) pair or a list of "
                        "those, got %r" % (outputs,))
    variables, modes = [], []
    for o in outputs:
        if _is_variable(o):
            variables.append(o)
            modes.append("avg")
        elif isinstance(o, tuple) and len(o) == 2 and _is_variable(o[0]):
            variables.append(o[0])
            modes.append(check_op(o[1], "output reduce operation"))
        else:
            raise TypeError("each output must be a variable or a (variable, op) pair, got %r" % (o,))
    return variables, modes, False


def _parse_updates(updates):
    if updates is None:
        return [], []
    if isinstance(updates, dict):
        updates = list(updates.items())
    if not isinstance(updates, (list, tuple)):
        raise TypeError("updates must be a list of (shared, update) pairs or (shared, update, op) "
                        "triples, got %r" % (updates,))
    pairs, modes = [], []
    for u in updates:
        if not isinstance(u, (list, tuple)) or len(u) not in (2, 3):
            raise TypeError("each update must be a (shared, update) pair or a (shared, update, op) "
                            "triple, got %r" % (u,))
        if not _is_shared(u[0]):
            raise TypeError("update target must be a shared variable, got %r" % (u[0],))
        pairs.append((u[0], u[1]))
        modes.append(check_op(u[2], "update reduce operation", allow_none=False) if len(u) == 3 else "avg")
    return pairs, modes


def _parse_givens(givens):
    if givens is None:
        return []
    if isinstance(givens, dict):
        return list(givens.items())
    pairs = isinstance(givens, (list, tuple)) and all(isinstance(g, (list, tuple)) and len(g) == 2
                                                      for g in givens)
    if pairs:
        return [tuple(g) for g in givens]
    raise TypeError("givens must be a dict or a list of (variable, replacement) pairs, got %r" % (givens,))


def function(inputs, outputs=None, bcast_inputs=None, updates=None, givens=None,
             sliceable_shareds=None, **kwargs):
    """Build a Synkhronos function: a replacement for ``pytensor.function``.

    Parameters
    ----------
    inputs : list of Variable
        Inputs scattered along axis 0 among the ranks.
    outputs : Variable, (Variable, op), or list of those, optional
        ``op`` is the reduce operation over ranks: ``"avg"`` (default; weighted by
        the rows each rank computed on, so it equals the single-process result),
        ``"sum"``, ``"prod"``, ``"max"``, ``"min"`` or None (a list with one result
        per rank that had rows).
    bcast_inputs : list of Variable, optional
        Inputs used whole on every rank.
    updates : list of (shared, update) or (shared, update, op), optional
        Updates apply locally on each rank.  ``op`` (default ``"avg"``) combines the
        updates computed over slices when called with ``num_slices > 1``; each slice
        is computed from the original values and the update is applied once.
    givens : dict or list of pairs, optional
        As in PyTensor.
    sliceable_shareds : list of SharedVariable, optional
        Shared variables holding data, to be selected by ``batch_s`` and split by
        ``num_slices``.  Each must appear in the function.
    **kwargs
        Passed on to ``pytensor.function`` (``mode``, ``name``, ...).

    Returns
    -------
    Function

    Raises
    ------
    RuntimeError
        If Synkhronos is not forked, or already distributed.
    TypeError
        If an argument is malformed.
    ValueError
        For an unknown reduce operation, or a sliceable shared variable that the
        function does not use.
    """
    rt = _runtime.require(distributed=False)
    from pytensor.graph.traversal import ancestors

    scat = _as_var_list(inputs, "inputs")
    bcast = _as_var_list(bcast_inputs, "bcast_inputs")
    seen = set()
    for v in scat + bcast:
        if v in seen:
            raise ValueError("inputs and bcast_inputs name the variable %s twice" % (v,))
        seen.add(v)
    for v in scat:
        if getattr(v, "ndim", 1) == 0:
            raise TypeError("scattered input %r is 0-d and cannot be split along axis 0; "
                            "pass it in bcast_inputs" % (v,))
    out_vars, out_modes, single = _parse_outputs(outputs)
    update_pairs, update_modes = _parse_updates(updates)
    given_pairs = _parse_givens(givens)
    sliceable = _as_var_list(sliceable_shareds, "sliceable_shareds")
    if not all(_is_shared(s) for s in sliceable):
        raise TypeError("sliceable_shareds must be shared variables, got %r" % (sliceable,))
    graph = out_vars + [u for _, u in update_pairs] + [g for _, g in given_pairs]
    used = set(ancestors(graph)) if graph else set()
    for s in sliceable:
        if s not in used:
            raise ValueError("sliceable shared variable %r is not used in the function" % (s,))
        if s.ndim == 0:
            raise TypeError("sliceable shared variable %r is 0-d and cannot be sliced" % (s,))
    kwargs = rt.device.function_kwargs(kwargs)
    if rt.device.precision == "bf16":
        from ._mixed import bf16_mode

        kwargs["mode"] = bf16_mode(kwargs.get("mode"))  # fork(precision="bf16"): see _mixed
    if is_jax_mode(kwargs.get("mode")):
        from ._jax_shapes import jax_mode

        kwargs["mode"] = jax_mode(kwargs["mode"])  # shapes computed from shapes stay concrete
    t0 = time.monotonic()
    plain = compile_function(scat + bcast, list(out_vars), updates=update_pairs,
                             givens=given_pairs, **kwargs)
    logger.debug("function %s built by PyTensor in %.2f s (%s)", repr(plain.name) if plain.name
                 else "#%d" % len(rt.functions), time.monotonic() - t0, type(plain.maker.linker).__name__)
    core = FunctionCore(len(rt.functions), plain, scat + bcast, len(scat), out_vars, out_modes,
                        update_pairs, update_modes, given_pairs, sliceable, kwargs)
    fn = Function(core, single, rt)
    rt.functions.append(fn)
    rt.register_shareds(plain.get_shared())
    return fn


def _in_graph_dtypes(results, dtypes):
    """``results`` in the dtypes the graph gives its outputs: JAX in 32-bit mode
    (GPU ranks with floatX float32) returns int64 outputs as int32."""
    out = []
    for r, dtype in zip(results, dtypes):
        if isinstance(r, list):  # reduce mode None: one result per rank
            out.append([v if v.dtype == dtype else v.astype(dtype) for v in r])
        else:
            out.append(r if r.dtype == dtype else np.asarray(r).astype(dtype))
    return out


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class Function:
    """A data-parallel function, returned by ``synkhronos.function()``."""

    def __init__(self, core, single_output, runtime):
        self._rt = runtime
        self._core = core
        self._single = single_output
        self._inputs = core.inputs
        names = {}
        for i, v in enumerate(self._inputs):
            if v.name is not None:
                names.setdefault(v.name, i)
        self._names = names
        self._reshaped = None
        name = core.plain.name
        self._what = "function %s" % (repr(name) if name else "#%d" % core.ID)
        self._label = "call of " + self._what
        self._ran = set()  # variants that have run on every rank (their first call compiled them)

    # ----------------------------------------------------------------- properties
    @property
    def name(self):
        """Name of the function, as in PyTensor."""
        return self._core.plain.name

    @property
    def output_modes(self):
        """Reduce operation of each output."""
        return list(self._core.output_modes)

    @property
    def update_modes(self):
        """Reduce operation of each update (used only when slicing)."""
        return list(self._core.update_modes)

    def _reshaped_ids(self, rt):
        """IDs of the shared variables whose shape a call may change: those updated
        without a fully static type shape (PyTensor checks updates against one)."""
        if self._reshaped is None:
            self._reshaped = [rt.shared_id(var) for var, _ in self._core.updates
                              if None in getattr(var.type, "shape", (None,))]
        return self._reshaped

    # -------------------------------------------------------------------- inputs
    def _order_inputs(self, args, kwargs):
        n = len(self._inputs)
        for key in kwargs:
            if key not in self._names:
                raise TypeError("unknown input name %r; inputs are named %s" % (key, sorted(self._names)))
        if len(args) + len(kwargs) != n:
            raise TypeError("function takes %d data inputs, got %d" % (n, len(args) + len(kwargs)))
        ordered = list(args) + [None] * len(kwargs)
        for key, value in kwargs.items():
            idx = self._names[key]
            if idx < len(args) or ordered[idx] is not None:
                raise TypeError("input %r given twice" % key)
            ordered[idx] = value
        return ordered

    def _check_datas(self, ordered, rt):
        for i, (d, var) in enumerate(zip(ordered, self._inputs)):
            if not isinstance(d, Data):
                raise TypeError(
                    "input %d (%s) must be a synkhronos.Data, got %s; wrap arrays with "
                    "synkhronos.data() or Function.build_inputs()" % (i, var, type(d).__name__))
            if d._rt is not rt:
                raise RuntimeError("input %d (%s) is a Data object of a closed Synkhronos session"
                                   % (i, var))
            if d.dtype != var.dtype and not np.can_cast(d.dtype, var.dtype, "safe"):
                raise TypeError("input %d (%s) needs dtype %s, got Data of dtype %s, which does not "
                                "convert without loss" % (i, var, var.dtype, d.dtype))
            if d.ndim != var.ndim:
                raise TypeError("input %d (%s) needs ndim %d, got Data of ndim %d"
                                % (i, var, var.ndim, d.ndim))
            if d._array is None:
                raise ValueError("input %d (%s) is a Data object with no memory allocated" % (i, var))

    def build_inputs(self, *args, force_cast=False, oversize=1, minibatch=False, **kwargs):
        """Make ``Data`` objects for this function's inputs, given as if calling
        the PyTensor function.

        Parameters
        ----------
        *args, **kwargs : array_like
            One value per input (keywords by input name).
        force_cast, oversize : optional
            Passed to ``synkhronos.data()``.
        minibatch : bool or list of bool, optional
            Passed to ``synkhronos.data()``; a list gives one per input.

        Returns
        -------
        Data or tuple of Data
        """
        ordered = self._order_inputs(args, kwargs)
        if isinstance(minibatch, (list, tuple)):
            if len(minibatch) != len(ordered):
                raise ValueError("minibatch list needs %d entries, got %d" % (len(ordered), len(minibatch)))
        else:
            minibatch = [minibatch] * len(ordered)
        datas = tuple(make_data(v, var, None, None, None, mb, force_cast, oversize, None,
                                "Function.build_inputs: input %d (%s)" % (i, var))
                      for i, (v, var, mb) in enumerate(zip(ordered, self._inputs, minibatch)))
        return datas[0] if len(datas) == 1 else datas

    def as_theano(self, *args, **kwargs):
        """Call the function in the master process only, as plain PyTensor
        (updates apply to the master's shared variables).  Inputs may be arrays
        or ``Data``."""
        args = [a._array if isinstance(a, Data) else a for a in args]
        kwargs = {k: (v._array if isinstance(v, Data) else v) for k, v in kwargs.items()}
        core = self._core
        results = core.variant(core.full_subset, False, None)(*args, **kwargs)
        return results[0] if self._single else results

    as_pytensor = as_theano

    def __reduce__(self):
        # A handle on a function of this session: unpickled in the process that runs
        # it (a deep copy, say), the function itself; anywhere else, a stand-in whose
        # calls say why they cannot run there (see _ForeignFunction).
        rt = self._rt
        return _function_handle, (rt.token, self._core.ID, self._what, rt.owner)

    # ---------------------------------------------------------------------- call
    def _check_subset(self, output_subset):
        n = len(self._core.outputs)
        if output_subset is None:
            return self._core.full_subset
        if not isinstance(output_subset, (list, tuple)) or not all(_is_int(i) for i in output_subset):
            raise TypeError("output_subset must be a list of ints, got %r" % (output_subset,))
        for i in output_subset:
            if not 0 <= i < n:
                raise ValueError("output_subset entry %d out of range for %d outputs" % (i, n))
        return tuple(output_subset)

    def _row_selection(self, scat, batch):
        """The selection over full-dataset inputs, and its length."""
        full = [d for d in scat if not d.minibatch]
        if batch is None:
            ref = full or scat
            lengths = {len(d) for d in ref}
            if len(lengths) > 1:
                raise ValueError("scattered inputs have different lengths %s; pass batch= or "
                                 "give them equal lengths" % [len(d) for d in ref])
            n = lengths.pop()
            sel = slice(0, n)
        else:
            sel = normalize_batch(batch, len(full[0]) if full else None)
            for d in full:
                check_selection_fits(sel, len(d), "input %s" % (d,))
            n = selection_length(sel)
        if n == 0:  # no rank would have an output to reduce
            if batch is not None:
                raise ValueError("batch=%s selects no rows; a call needs at least one" % brief(batch))
            raise ValueError("the scattered inputs %s have no rows; a call needs at least one"
                             % ", ".join(repr(d) for d in scat))
        for d in scat:
            if d.minibatch and len(d) < n:
                raise ValueError("minibatch input %s has %d rows but the call selects %d" % (d, len(d), n))
        return sel, n

    def __call__(self, *args, output_subset=None, batch=None, batch_s=None, num_slices=1, **kwargs):
        """Run on all ranks and reduce the outputs to the master.

        Parameters
        ----------
        *args, **kwargs : Data
            One per input (scattered inputs first, then broadcast inputs).
        output_subset : list of int, optional
            Compute and return only these outputs (always as a list).
        batch : int, slice, list of int or 1-d int array, optional
            Rows of the scattered inputs to use, selected before splitting
            (``int n`` means the first n rows).  Minibatch inputs are indexed by
            position within the selection.
        batch_s : slice, list of int, 1-d int array, or a list of those per rank
            Rows of the sliceable shared variables to use on each rank.
        num_slices : int, optional
            Compute each rank's share in this many slices, accumulating outputs
            and updates (see ``function``).

        Returns
        -------
        array or list of arrays

        Raises
        ------
        RuntimeError
            If not distributed, or closed.
        TypeError, ValueError
            For malformed arguments.
        WorkerError
            If the function failed in a worker.

        Notes
        -----
        On GPU ranks, a call that returns no outputs and takes no ``Data``
        inputs (say, a parameter update, or a step on ``sliceable_shareds``)
        returns once every rank has queued it, like the collectives.  A worker's
        error in it is raised by the next call, collective or ``synchronize()``
        that waits for the workers.
        """
        rt = _runtime.require(distributed=True)
        if rt is not self._rt:
            raise RuntimeError("this function belongs to a closed Synkhronos session; build "
                               "functions again after fork()")
        core = self._core
        ordered = self._order_inputs(args, kwargs)
        self._check_datas(ordered, rt)
        subset = self._check_subset(output_subset)
        if isinstance(num_slices, bool) or not isinstance(num_slices, numbers.Real):
            raise TypeError("num_slices must be a positive int, got %r" % (num_slices,))
        if num_slices < 1 or int(num_slices) != num_slices:
            raise ValueError("num_slices must be a positive int, got %r" % (num_slices,))
        num_slices = int(num_slices)
        scat, bcast = ordered[:core.n_scatter], ordered[core.n_scatter:]
        if num_slices > 1 and not scat and not core.sliceable:
            raise ValueError("num_slices=%d but the function has nothing to slice (no scattered "
                             "inputs or sliceable shared variables)" % num_slices)
        if batch is not None and not scat:
            raise TypeError("batch=%r given but the function has no scattered inputs" % (batch,))
        if batch_s is not None and not core.sliceable:
            raise TypeError("batch_s=%r given but the function has no sliceable_shareds" % (batch_s,))
        share_sels = [None] * rt.n_parallel if batch_s is None else normalize_batch_s(batch_s, rt.n_parallel)
        if batch_s is not None and not scat and not any(selection_length(s) for s in share_sels):
            raise ValueError("batch_s=%s selects no rows on any rank; a call needs at least one"
                             % brief(batch_s))

        rank_scat = [[] for _ in range(rt.n_parallel)]
        weighted = True  # whether avg must weight ranks by their rows (see FunctionCore.run_reduced)
        if scat:
            sel, n = self._row_selection(scat, batch)
            weighted = n % rt.n_parallel != 0
            for rank, (p0, p1) in enumerate(split_bounds(n, rt.n_parallel)):
                for d in scat:
                    rank_scat[rank].append(slice(p0, p1) if d.minibatch else sub_selection(sel, p0, p1))

        rt.publish(scat + bcast)  # other hosts' copies (MPI launch)
        bcast_refs = [d._ref() for d in bcast]
        scat_refs = [d._ref() for d in scat]
        payloads = {
            r: (core.ID, list(zip(scat_refs, rank_scat[r])), bcast_refs, share_sels[r], subset, num_slices,
                weighted)
            for r in rt.worker_ranks
        }
        m = rt.master_rank
        args = ([(d._array, s) for d, s in zip(scat, rank_scat[m])], [d._array for d in bcast],
                share_sels[m], subset, num_slices)
        # On GPUs, outputs of static shape are reduced into the master on the
        # device; every rank makes the same choice from the same facts.
        specs = core.device_reduction(rt.device, subset, num_slices)

        def local():
            if specs is not None:
                return core.run_reduced(rt.device, specs, m, weighted, *args)
            weight, outputs = core.run_local(rt.device, *args)
            # On the host before the master waits for the workers (they copy theirs meanwhile).
            return weight, outputs if outputs is None else rt.device.to_host(outputs)

        # Compile a new variant here first: workers then load it from PyTensor's warm cache
        # instead of each compiling it at once.
        key = core.prepare(subset, num_slices, share_sels[m])
        # Numba and JAX compile on a function's first call, on every rank: say so if it takes long.
        first = key not in self._ran
        notice = _log.compile_notice(self._what, core.compiled(*key), rt.n_parallel) if first else None
        # Queued devices: a call with nothing to return and no Data to read (which
        # the user may overwrite once the call returns) need not wait for the workers.
        posted = rt.device.queued and not subset and not ordered
        rt.action = self._label
        failed = True
        try:
            if posted:
                rt.post(Command.CALL, payloads, local=local, binding=False)
                failed = False
                return []
            mine, replies = rt.request(Command.CALL, payloads, local=local)
            failed = False
        finally:
            rt.action = None
            for i in self._reshaped_ids(rt):
                rt.shapes.pop(i, None)
            if first:
                if notice is not None:
                    notice.close(failed)
                if not failed:
                    self._ran.add(key)
        if specs is not None:
            results = self._take_reduced(rt, specs, mine, replies, weighted)
        else:
            per_rank = {m: mine}
            for r, (weight, tokens) in replies.items():
                per_rank[r] = (weight, None if tokens is None else receive(tokens, rt.cache))
            results = _in_graph_dtypes(self._reduce(per_rank, subset), [core.out_dtypes[i] for i in subset])
        if output_subset is None and self._single:
            return results[0]
        return results

    @staticmethod
    def _take_reduced(rt, specs, mine, replies, weighted=True):
        """The outputs the device reduced into the master, on the host; ``avg``
        divided by the rows of every rank that had some (as ``_reduce`` weights),
        or, where the ranks sent their outputs unweighted (equal rows), by the
        number of those ranks."""
        weight, had_rows, results = mine
        ranks = [(weight, had_rows)] + list(replies.values())
        if not any(had for _, had in ranks):
            raise ValueError("the call selected no rows on any rank")
        total = sum(w if weighted else 1 for w, had in ranks if had)
        host = rt.device.take_outputs(results)
        for h, (_, _, mode) in zip(host, specs):
            if mode == "avg":  # a float dtype (see device_reduction), in a fresh array
                np.true_divide(h, total, out=h, casting="unsafe")
        return host

    def _reduce(self, per_rank, subset):
        ranks = [r for r in sorted(per_rank) if per_rank[r][1] is not None]
        if not ranks:
            raise ValueError("the call selected no rows on any rank")
        weights = [per_rank[r][0] for r in ranks]
        results = []
        for j, i in enumerate(subset):
            values = [per_rank[r][1][j] for r in ranks]
            mode = self._core.output_modes[i]
            if mode is None:
                results.append([np.array(v) for v in values])
                continue
            shapes = [np.shape(v) for v in values]
            if len(set(shapes)) > 1:
                raise ValueError("output %d of %s has shapes %s on ranks %s: an output reduced with %r "
                                 "needs one shape on every rank (reduce mode None returns each rank's "
                                 "value)" % (i, self._what, shapes, ranks, mode))
            results.append(reduce_values(values, mode, weights))
        return results


def _function_handle(token, index, what, owner):
    """A pickled ``Function`` unpickled: the live function if this process holds
    its session, else a ``_ForeignFunction``."""
    rt = _runtime.current()
    if rt is not None and rt.token == token:
        return rt.functions[index]
    return _ForeignFunction(what, owner)


class _ForeignFunction:
    """What a Synkhronos function becomes in another process (a pickled copy in a
    spawned child, say): calling it raises RuntimeError naming the rule that only
    the process that called ``fork()`` may call its session's functions."""

    def __init__(self, what, owner):
        self._what = what
        self._owner = owner

    def __repr__(self):
        return "<%s of the Synkhronos session of pid %d>" % (self._what, self._owner)

    def __call__(self, *args, **kwargs):
        if self._owner == os.getpid():  # pickled before its session closed
            raise RuntimeError("%s belongs to a closed Synkhronos session; build functions again after "
                               "fork()" % self._what)
        raise RuntimeError(
            "%s belongs to the Synkhronos session of pid %d; this process (pid %d) has no part in it: "
            "only the process that called synkhronos.fork() may call its functions and collectives. "
            "Call it there, or compile a plain PyTensor function for this process."
            % (self._what, self._owner, os.getpid()))

    as_theano = as_pytensor = __call__
