"""``synk.function()``: PyTensor functions that run data-parallel on all ranks."""

import logging
import time

from ._call.plan import order_inputs, plan_call
from ._call.results import in_graph_dtypes, reduce_results, take_reduced
from ._call.share import device_reduction, run_share, run_share_reduced, share_rows
from ._common import log
from ._common.values import array_fits
from ._data import Data, make_data
from ._graph.arguments import (
    as_var_list,
    check_inputs,
    check_sliceable,
    parse_givens,
    parse_outputs,
    parse_updates,
)
from ._graph.function_core import FunctionCore
from ._graph.linking import compile_for_device
from ._graph.precompile import precompile
from ._session import runtime
from ._session.foreign import function_handle
from ._wire.exchange_buffer import unpack

__all__ = ["function", "Function"]

logger = logging.getLogger(__name__)


@runtime.action("synkhronos.function()")
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
        If Synkhronos is not forked.
    TypeError
        If an argument is malformed.
    ValueError
        For an unknown reduce operation, or a sliceable shared variable that the
        function does not use.
    """
    rt = runtime.require()
    scat = as_var_list(inputs, "inputs")
    bcast = as_var_list(bcast_inputs, "bcast_inputs")
    check_inputs(scat, bcast)
    out_vars, out_modes, single = parse_outputs(outputs)
    update_pairs, update_modes = parse_updates(updates)
    given_pairs = parse_givens(givens)
    sliceable = as_var_list(sliceable_shareds, "sliceable_shareds")
    check_sliceable(sliceable, out_vars + [u for _, u in update_pairs] + [g for _, g in given_pairs])
    index = rt.registry.next_function_index()
    t0 = time.monotonic()
    plain, kwargs, why = compile_for_device(rt.device, scat + bcast, out_vars, update_pairs, given_pairs,
                                            kwargs, "#%d" % index)
    logger.debug("function %s built by PyTensor in %.2f s; linker %s: %s", repr(plain.name) if plain.name
                 else "#%d" % index, time.monotonic() - t0, type(plain.maker.linker).__name__, why)
    core = FunctionCore(index, plain, scat + bcast, len(scat), out_vars, out_modes,
                        update_pairs, update_modes, given_pairs, sliceable, kwargs)
    fn = Function(core, single, rt)
    rt.registry.add_function(fn, plain.get_shared())
    return fn


class Function:
    """A data-parallel function, returned by ``synkhronos.function()``."""

    def __init__(self, core, single_output, rt):
        self._rt = rt
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
            self._reshaped = [rt.registry.shared_id(var) for var, _ in self._core.updates
                              if None in getattr(var.type, "shape", (None,))]
        return self._reshaped

    # -------------------------------------------------------------------- inputs
    def _order_inputs(self, args, kwargs):
        return order_inputs(args, kwargs, len(self._inputs), self._names)

    def _check_datas(self, ordered, rt):
        for i, (d, var) in enumerate(zip(ordered, self._inputs)):
            if not isinstance(d, Data):
                raise TypeError(
                    "input %d (%s) must be a synkhronos.Data, got %s; wrap arrays with "
                    "synkhronos.data() or Function.build_inputs()" % (i, var, type(d).__name__))
            if d._rt is not rt:
                raise RuntimeError("input %d (%s) is a Data object of a closed Synkhronos session"
                                   % (i, var))
            if d.dtype != var.dtype and not array_fits(d.dtype, var.dtype):  # the usual case first
                raise TypeError("input %d (%s) needs dtype %s, got Data of dtype %s, which does not "
                                "convert without loss" % (i, var, var.dtype, d.dtype))
            if d.ndim != var.ndim:
                raise TypeError("input %d (%s) needs ndim %d, got Data of ndim %d"
                                % (i, var, var.ndim, d.ndim))
            if d._memory.array is None:
                raise ValueError("input %d (%s) is a Data object with no memory allocated" % (i, var))

    @runtime.action("Function.build_inputs()")
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
        datas = tuple(make_data(v, var, minibatch=mb, force_cast=force_cast, oversize=oversize,
                                argname="Function.build_inputs: input %d (%s)" % (i, var))
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
        return function_handle, (rt.token, self._core.ID, self._what, rt.owner)

    # ---------------------------------------------------------------------- call
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
            If not distributed (since it was built), or closed.
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
        own = self._rt
        if own.foreign:
            own.check_owner()
        with own.lock:  # one call at a time, whichever thread calls (see runtime.locked)
            return self._call(args, kwargs, output_subset, batch, batch_s, num_slices)

    def _call(self, args, kwargs, output_subset, batch, batch_s, num_slices):
        rt = runtime.require(distributed=True)
        if rt is not self._rt:
            raise RuntimeError("this function belongs to a closed Synkhronos session; build "
                               "functions again after fork()")
        core = self._core
        ordered = self._order_inputs(args, kwargs)
        self._check_datas(ordered, rt)
        plan = plan_call(ordered, core.n_scatter, len(core.outputs), core.sliceable, rt.n_parallel,
                         output_subset, batch, batch_s, num_slices)
        if rt.cluster is not None:  # other hosts' copies (MPI launch)
            rt.publisher.publish([d._memory for d in ordered])
        # On GPUs, outputs of static shape are reduced into the master on the
        # device; every rank makes the same choice from the same facts.
        specs = device_reduction(core, rt.device, plan.subset, plan.num_slices)
        mine, replies = self._run_on_ranks(rt, plan, specs)
        if mine is None:
            return []
        if specs is not None:
            results = take_reduced(rt.device, specs, mine, replies, plan.weighted)
        else:
            per_rank = {rt.master_rank: mine}
            for r, (weight, tokens) in replies.items():
                per_rank[r] = (weight, None if tokens is None else unpack(tokens, rt.cache))
            results = reduce_results(per_rank, plan.subset, core.output_modes, self._what, rt.reduce_pool)
            results = in_graph_dtypes(results, [core.out_dtypes[i] for i in plan.subset])
        if output_subset is None and self._single:
            return results[0]
        return results

    def _call_master_alone(self, *args):
        """The master's share of a call of broadcast inputs ``args`` only, the
        workers left idle: the same outputs as ``__call__`` where no worker
        holds rows of the function's shared variables (``synkhronos.pymc``
        places them so where one rank is faster).  Always a list."""
        own = self._rt
        if own.foreign:
            own.check_owner()
        with own.lock:
            rt = runtime.require(distributed=True)
            core, m = self._core, rt.master_rank
            ordered = self._order_inputs(args, {})
            self._check_datas(ordered, rt)
            plan = plan_call(ordered, core.n_scatter, len(core.outputs), core.sliceable, rt.n_parallel)
            if plan.scat:
                raise TypeError("%s scatters inputs: it runs on every rank" % self._what)
            weight, outputs = run_share(core, rt.device, *plan.master_args(m))
            outputs = {m: (weight, rt.device.to_host(outputs))}
            results = reduce_results(outputs, plan.subset, core.output_modes, self._what)
            return in_graph_dtypes(results, [core.out_dtypes[i] for i in plan.subset])

    def _local(self, rt, plan, specs):
        """The master's share of a call, as a function of no arguments.  It
        takes its arguments when it runs, after the workers were sent theirs:
        a tiny call's round trip is the worker's path, so the master does what
        it can once the message is on its way."""
        core, device, m = self._core, rt.device, rt.master_rank

        def local():
            args = plan.master_args(m)
            if specs is not None:
                return run_share_reduced(core, device, specs, m, plan.weighted, *args)
            weight, outputs = run_share(core, device, *args)
            # On the host before the master waits for the workers (they copy theirs meanwhile).
            return weight, outputs if outputs is None else device.to_host(outputs)

        return local

    def _run_on_ranks(self, rt, plan, specs):
        """Run ``plan`` on every rank: ``(master's result, workers' replies)``, or
        ``(None, None)`` for a call that was only queued."""
        key = self._variant_key(rt, plan)
        if key not in self._ran:
            return self._run_first_on_ranks(rt, plan, specs, key)
        return self._dispatch(rt, plan, specs)

    def _variant_key(self, rt, plan):
        """The variant the master's share runs (by the rule every rank follows), or
        None where the master's rows are wrong: its share raises why, once the
        workers have run theirs."""
        core, share_sel = self._core, plan.share_sels[rt.master_rank]
        if plan.num_slices == 1:  # one slice whatever the rows: nothing to look at
            return core.variant_key(plan.subset, 1, share_sel)
        scattered = plan.master_args(rt.master_rank)[0]
        try:
            _, slices = share_rows(core, rt.device, scattered, share_sel, plan.num_slices)
        except ValueError:
            return None
        return core.variant_key(plan.subset, slices, share_sel)

    def _dispatch(self, rt, plan, specs):
        core = self._core
        workers = rt.worker_ranks
        messages = plan.messages(core.ID, workers)
        local = self._local(rt, plan, specs)
        dispatcher = rt.dispatcher
        dispatcher.action = self._label
        try:
            # Queued devices: a call with nothing to return and no Data to read (which
            # the user may overwrite once the call returns) need not wait for the workers.
            if rt.device.queued and not plan.subset and not (plan.scat or plan.bcast):
                dispatcher.post(messages, workers, local=local, binding=False)
                return None, None
            return dispatcher.request(messages, workers, local=local)
        finally:
            dispatcher.action = None
            reshaped = self._reshaped_ids(rt)
            if reshaped:
                rt.registry.forget_shapes(reshaped)

    def _run_first_on_ranks(self, rt, plan, specs, key):
        """``_run_on_ranks`` for the first call of a variant (``key``): compiled here
        first (Numba), so that the workers load it from PyTensor's warm cache
        instead of each compiling it at once, and announced if it takes long.
        Checked here, once per variant and not on every call: whether the
        workers hold this function yet.  ``key`` None: nothing to compile ahead
        (see ``_variant_key``)."""
        if not rt.registry.is_distributed(self._core.ID):
            raise RuntimeError("this function was built after the last synkhronos.distribute(): "
                               "call distribute() again to send it to the workers")
        refusal = rt.registry.refusal(self._core.ID)
        if refusal is not None:
            raise TypeError(str(refusal)) from refusal.__cause__
        if key is None:
            return self._dispatch(rt, plan, specs)
        compiled = self._core.compiled(*key)
        notice = log.compile_notice(self._what, compiled, rt.n_parallel)
        failed = True
        try:
            precompile(compiled)
            self._ran.add(key)
            result = self._dispatch(rt, plan, specs)
            failed = False
            return result
        except BaseException:
            self._ran.discard(key)
            raise
        finally:
            if notice is not None:
                notice.close(failed)

