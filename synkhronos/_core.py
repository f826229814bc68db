"""The part of a Synkhronos function that runs on every rank.

A ``FunctionCore`` holds the compiled PyTensor function and the symbolic graph it
came from.  Variants that a call may need (an output subset, slicing with
accumulated updates, ``batch_s`` on sliceable shared variables) are compiled from
that graph on first use, in whichever process needs them.  Cores are pickled
together at ``distribute()``, so the shared variables of all functions keep their
correspondence in every worker.
"""

import contextlib
import copy
import copyreg
import io
import pickle
import warnings

import numpy as np

from ._plan import (
    check_selection_fits,
    selection_length,
    split_bounds,
    sub_selection,
    take_rows,
)
from ._reduce import Accumulator

__all__ = ["FunctionCore", "compile_function", "dumps_cores", "is_jax_mode", "reseed_generators",
           "compiler_warnings_hidden"]

# JAX, when PyTensor's JAX backend asks it for an int64 or float64 value (index
# arithmetic, float64 accumulators of float32 sums) in 32-bit mode.
JAX_DTYPE_WARNING = "Explicitly requested dtype (int64|float64|uint64) requested in .* is not available"


@contextlib.contextmanager
def compiler_warnings_hidden(linker=None):
    """Hide the warnings that PyTensor's backends raise while they compile a
    function, about code PyTensor generates, which a user cannot act on: the
    JAX backend's copies of random generators (see ``compile_function``),
    JAX's 32-bit dtypes (``JAX_DTYPE_WARNING``) and Numba's object mode for the
    bf16 emulation (``synkhronos._mixed``).

    For compiling only: ``warnings.catch_warnings`` swaps the process's filters
    while the block runs, which costs microseconds and is not thread-safe, so
    calls go through it only when JAX traces them (see ``FunctionCore.variant``).

    Parameters
    ----------
    linker : pytensor Linker, optional
        The linker that compiles the function.
    """
    if type(linker).__name__ == "NumbaLinker":
        # PyTensor hides Numba's false warnings about its generated code ("np.dot() is
        # faster on contiguous arrays" for its transposes, numba/numba#10086) with a
        # process-wide filter that it installs when its Numba backend is first imported.
        # Imported inside catch_warnings, that filter would end with the block.
        import pytensor.link.numba.dispatch  # noqa: F401
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The RandomType SharedVariables", category=UserWarning)
        warnings.filterwarnings("ignore", message=JAX_DTYPE_WARNING, category=UserWarning)
        # fork(precision="bf16") on CPU workers: the emulation is a Python perform by design
        # (see _mixed), which Numba runs in object mode and says so for each node.
        warnings.filterwarnings("ignore", message="Numba will use object mode to run Bf16",
                                category=UserWarning)
        yield


class FunctionCore:
    """Executable core of one Synkhronos function (see module docstring).

    Parameters
    ----------
    ID : int
        Index of the function in the runtime.
    plain : pytensor Function
        The function as the user asked for it (all outputs, updates applied).
    inputs : list of Variable
        Scattered inputs followed by broadcast inputs.
    n_scatter : int
        How many of ``inputs`` are scattered.
    outputs, output_modes : list
        Output variables and their reduce operations.
    updates, update_modes : list
        ``(shared, expression)`` pairs and their reduce operations for slicing.
    givens : list of pairs
    sliceable : list of SharedVariable
    kwargs : dict
        Passed on to every ``pytensor.function`` call.
    """

    def __init__(self, ID, plain, inputs, n_scatter, outputs, output_modes,
                 updates, update_modes, givens, sliceable, kwargs):
        self.ID = ID
        self.inputs = inputs
        self.n_scatter = n_scatter
        self.outputs = outputs
        self.output_modes = output_modes
        self.updates = updates
        self.update_modes = update_modes
        self.givens = givens
        self.sliceable = sliceable
        self.kwargs = kwargs
        self.in_dtypes = [np.dtype(v.dtype) for v in inputs]
        self.out_dtypes = [np.dtype(v.dtype) for v in outputs]
        # JAX needs static slice bounds: select rows of sliceable shareds by index there.
        self.index_only = is_jax_mode(kwargs.get("mode"))
        self.full_subset = tuple(range(len(outputs)))
        self._variants = {(self.full_subset, False, None): plain}
        # What ``variant`` returns, by key: the compiled function, wrapped for JAX.
        self._callables = {}
        self._reductions = {}  # (subset, device's reduce dtypes) -> device_reduction's answer

    @property
    def plain(self):
        return self._variants[(self.full_subset, False, None)]

    def __getstate__(self):
        state = self.__dict__.copy()
        # Only the plain function travels; the others are re-made where needed.
        key = (self.full_subset, False, None)
        state["_variants"] = {key: self._variants[key]}
        state["_callables"] = {}
        state["_reductions"] = {}
        return state

    # ------------------------------------------------------------------ variants
    def variant(self, subset, accumulate, share_kind):
        """The compiled function for an output ``subset`` (tuple of indices),
        with updates returned as outputs when ``accumulate``, and the sliceable
        shared variables indexed by a slice or an index vector (``share_kind``
        ``'slice'``/``'index'``/None), to call.

        JAX traces and compiles a function when it is called with new argument
        shapes, and then warns about dtypes of PyTensor's code: for JAX-mode
        functions this returns a wrapper that hides those warnings on such
        calls only (``compiler_warnings_hidden``)."""
        key = (subset, accumulate, share_kind)
        fn = self._callables.get(key)
        if fn is None:
            fn = self.compiled(subset, accumulate, share_kind)
            if self.index_only:
                fn = _hiding_on_new_shapes(fn)
            self._callables[key] = fn
        return fn

    def compiled(self, subset, accumulate, share_kind):
        """The PyTensor function of a ``variant``, compiled now if needed."""
        key = (subset, accumulate, share_kind)
        fn = self._variants.get(key)
        if fn is None:
            fn = self._variants[key] = self._compile(subset, accumulate, share_kind)
        return fn

    def _compile(self, subset, accumulate, share_kind):
        import pytensor.tensor as pt

        ins = list(self.inputs)
        givens = list(self.givens)
        if share_kind == "slice":
            start, stop = pt.lscalar("synk_start"), pt.lscalar("synk_stop")
            ins += [start, stop]
            givens += [(s, s[start:stop]) for s in self.sliceable]
        elif share_kind == "index":
            idx = pt.lvector("synk_index")
            ins.append(idx)
            givens += [(s, s[idx]) for s in self.sliceable]
        outs = [self.outputs[i] for i in subset]
        updates = self.updates
        if accumulate:
            outs += [u for _, u in updates]
            updates = []
        if self.index_only:
            from . import _jax_shapes  # noqa: F401  (registers the rewrite the mode names)
        kwargs = dict(self.kwargs)
        kwargs.setdefault("on_unused_input", "ignore")
        return compile_function(ins, outs, updates=updates, givens=givens, **kwargs)

    def prepare(self, subset, num_slices, share_sel):
        """Compile the variant a call with these arguments will most likely use;
        returns its key ``(subset, accumulate, share_kind)``."""
        if num_slices > 1 and (self.n_scatter or self.sliceable):
            key = subset, bool(self.updates), self._sliced_kind(share_sel)
        else:
            key = subset, False, self._share_args(share_sel, None)[0]
        self.compiled(*key)
        return key

    def _sliced_kind(self, share_sel):
        if not self.sliceable:
            return None
        return "index" if self.index_only or isinstance(share_sel, np.ndarray) else "slice"

    def _share_args(self, share_sel, part):
        """Extra inputs that select rows of the sliceable shared variables."""
        if share_sel is None and part is None:
            return None, []
        if share_sel is None:
            sel = slice(*part)
        elif part is None:
            sel = share_sel
        else:
            sel = sub_selection(share_sel, *part)
        if isinstance(sel, slice) and not self.index_only:
            return "slice", [np.asarray(sel.start, dtype=np.int64), np.asarray(sel.stop, dtype=np.int64)]
        if isinstance(sel, slice):
            sel = np.arange(sel.start, sel.stop)
        return "index", [np.ascontiguousarray(sel, dtype=np.int64)]

    # ----------------------------------------------------------------- execution
    def device_reduction(self, device, subset, num_slices):
        """How ``device`` reduces a call's outputs itself: ``(shape, dtype, mode)``
        per output of ``subset``, or None when they go to the master through the
        host.  Decided from the graph and the call alone, so that every rank
        decides alike: each output needs a reduce mode, a static shape (the ranks
        must agree on sizes before they run), a dtype the device reduces (a float
        one for ``avg``); and the call must not be sliced (slices accumulate on
        the host)."""
        if not device.reduces_outputs or num_slices > 1 or not subset:
            return None
        key = (subset, device.reduce_dtypes)  # asked on every call, by every rank
        if key not in self._reductions:
            self._reductions[key] = self._reduction_specs(subset, device.reduce_dtypes)
        return self._reductions[key]

    def _reduction_specs(self, subset, reduce_dtypes):
        specs = []
        for i in subset:
            out, mode = self.outputs[i], self.output_modes[i]
            shape = getattr(out.type, "shape", None)
            if mode is None or shape is None or any(d is None for d in shape):
                return None
            dtype = np.dtype(out.type.dtype)
            if dtype.name not in reduce_dtypes or (mode == "avg" and dtype.kind != "f"):
                return None
            specs.append((tuple(int(d) for d in shape), dtype.name, mode))
        return specs

    def run_reduced(self, device, specs, root, weighted, *args):
        """``run_local(device, *args)``, then queue the reduction of its outputs
        into rank ``root`` on the device (``specs`` from ``device_reduction``).

        ``weighted``: each rank sends ``avg`` outputs times its rows, for the
        master to divide by the total.  When every rank has the same number of
        rows the master says so (False) and the outputs go as they are, to be
        divided by the number of ranks: the same mean, without a kernel per
        output on every rank (15 us of host time each on an H100).

        A rank whose share failed still takes part, with identity values, so that
        no rank waits forever; the error is raised after.

        Returns
        -------
        (weight, had_rows, results)
            ``results`` is the device's handle on the reduced outputs on root
            (``device.take_outputs`` copies them to the host), None elsewhere.
        """
        try:
            weight, outputs = self.run_local(device, *args)
        except Exception:
            device.reduce_outputs(None, specs, 0, root)
            raise
        results = device.reduce_outputs(outputs, specs, weight if weighted else 1, root)
        return weight, outputs is not None, results

    def _fit(self, arrays):
        """Safely upcast inputs whose Data dtype differs from the variable's (as
        ``pytensor.function`` does for numpy inputs); each rank casts its rows."""
        return [a if a.dtype == dt else a.astype(dt) for a, dt in zip(arrays, self.in_dtypes)]

    def _share_length(self, device, share_sel, need_equal):
        # Through the device: no copy, and in the master no wait for posted work.
        lengths = [device.shape(s)[0] for s in self.sliceable]
        if share_sel is None:
            if need_equal and len(set(lengths)) > 1:
                raise ValueError(
                    "sliceable shared variables %s have different lengths %s; pass batch_s "
                    "or give them equal lengths" % (self.sliceable, lengths)
                )
            return lengths[0]
        for s, n in zip(self.sliceable, lengths):
            check_selection_fits(share_sel, n, "sliceable shared variable %s" % s, "batch_s")
        return selection_length(share_sel)

    def run_local(self, device, scattered, bcast, share_sel, subset, num_slices):
        """Run this rank's share of a call.

        Parameters
        ----------
        device : device layer
            Sets the accumulated updates of a sliced call.
        scattered : list of (array, selection or None)
            Each scattered input with the rows this rank uses.
        bcast : list of array
            Broadcast inputs, used whole.
        share_sel : selection or None
            ``batch_s`` for this rank.
        subset : tuple of int
            Output indices to compute.
        num_slices : int
            Slices to compute over, accumulating outputs and updates.

        Returns
        -------
        (weight, outputs)
            ``weight`` is the number of rows used (1 when there is nothing to
            split); ``outputs`` is a list, or None when the rank had no rows.
        """
        n_rows = None
        if scattered:
            n_rows = len(scattered[0][0]) if scattered[0][1] is None else selection_length(scattered[0][1])
        share_len = None
        if self.sliceable and (share_sel is not None or num_slices > 1 or n_rows is None):
            share_len = self._share_length(device, share_sel, need_equal=num_slices > 1)
            if n_rows is not None and (share_sel is not None or num_slices > 1) and share_len != n_rows:
                raise ValueError(
                    "scattered inputs give %d rows on this rank but the sliceable shared "
                    "variables give %d; their lengths must match" % (n_rows, share_len)
                )
        weight = n_rows if n_rows is not None else share_len
        if weight is None:  # nothing to split: every rank runs the whole function
            return 1, self.variant(subset, False, None)(*self._fit(bcast))
        if weight == 0:
            return 0, None
        slices = min(num_slices, weight)
        if slices == 1:
            kind, share_args = self._share_args(share_sel, None)
            ins = [take_rows(a, sel) for a, sel in scattered] + list(bcast)
            ins = self._fit(ins) + share_args
            return weight, self.variant(subset, False, kind)(*ins)
        return weight, self._run_sliced(device, scattered, bcast, share_sel, subset, weight, slices)

    def _run_sliced(self, device, scattered, bcast, share_sel, subset, length, slices):
        accumulate = bool(self.updates)
        kind = self._sliced_kind(share_sel)
        fn = self.variant(subset, accumulate, kind)
        out_accs = [Accumulator(self.output_modes[i]) for i in subset]
        upd_accs = [Accumulator(m) for m in self.update_modes] if accumulate else []
        for start, stop in split_bounds(length, slices):
            ins = []
            for a, sel in scattered:
                part = slice(start, stop) if sel is None else sub_selection(sel, start, stop)
                ins.append(take_rows(a, part))
            ins = self._fit(ins + list(bcast))
            if kind is not None:
                ins += self._share_args(share_sel, (start, stop))[1]
            results = device.to_host(fn(*ins))
            for acc, r in zip(out_accs + upd_accs, results):
                acc.add(r, stop - start)
        for (var, _), acc in zip(self.updates if accumulate else (), upd_accs):
            device.set_value(var, _combine_slices(acc))
        return [_combine_slices(acc) for acc in out_accs]


def _hiding_on_new_shapes(fn):
    """``fn`` (a JAX-mode function), called inside ``compiler_warnings_hidden``
    when its arguments have shapes it has not seen: then JAX traces it again.
    Checking shapes costs far less than ``catch_warnings`` on every call."""
    seen = set()

    def call(*args, **kwargs):
        shapes = tuple(getattr(a, "shape", None) for a in args)
        if shapes in seen:
            return fn(*args, **kwargs)
        with compiler_warnings_hidden():
            result = fn(*args, **kwargs)
        seen.add(shapes)
        return result

    return call


def compile_function(inputs, outputs, **kwargs):
    """``pytensor.function(inputs, outputs, **kwargs)``, without the JAX backend's
    warning that a function uses a copy of each random generator: Synkhronos
    reseeds those copies per rank (``reseed_generators``), and the README says
    that the shared generator itself does not advance."""
    import pytensor
    from pytensor.compile.mode import get_mode

    with compiler_warnings_hidden(get_mode(kwargs.get("mode")).linker):
        return pytensor.function(inputs, outputs, **kwargs)


def is_jax_mode(mode):
    """Whether ``mode`` (a name, a Mode or None) links with PyTensor's JAX linker."""
    if mode is None:
        return False
    if isinstance(mode, str):
        return mode.upper() == "JAX"
    return type(getattr(mode, "linker", None)).__name__ == "JAXLinker"


def _combine_slices(acc):
    """Result of an accumulator over slices; ``None`` mode joins the slices."""
    result = acc.result()
    if acc.op is not None:
        return result
    if result[0].ndim == 0:
        return np.stack(result)
    return np.concatenate(result)


def _reseeded(value, rank):
    """A generator for ``rank`` derived from numpy ``Generator`` ``value``; None
    for any other value."""
    if not isinstance(value, np.random.Generator):
        return None
    entropy = [int(e) for e in copy.deepcopy(value).integers(0, 2**63, size=4)]
    seq = np.random.SeedSequence(entropy, spawn_key=(rank,))
    return np.random.Generator(type(value.bit_generator)(seq))


def reseed_generators(shareds, cores, rank):
    """Give rank ``rank`` its own random stream, so that dropout and other
    sampling differ between ranks instead of repeating the same draws on every
    part of the batch.  Reseeds every numpy ``Generator`` shared variable
    (``pt.random``, ``RandomStream``) and any copy a compiled function holds
    instead of the variable's own.  The new seed comes from the current
    state and the rank, so a seeded run is reproducible.

    PyTensor's JAX backend compiles a private copy of each generator into a
    function, converted to JAX's form (a dict of arrays) that cannot be
    reseeded; that copy is made again from the reseeded variable, as PyTensor
    makes it from the variable when it compiles the function."""
    cells, jax_copies = [var.container.storage for var in shareds], []
    for core in cores:
        for fn in core._variants.values():
            for inp, container in zip(fn.maker.inputs, fn.input_storage):
                if isinstance(container.storage[0], dict):
                    jax_copies.append((container.storage, inp.variable))
                else:
                    cells.append(container.storage)
    for cell in {id(c): c for c in cells}.values():  # a cell shared by functions once
        new = _reseeded(cell[0], rank)
        if new is not None:
            cell[0] = new
    for cell, var in jax_copies:
        value = var.container.storage[0]
        if isinstance(value, np.random.Generator):
            from pytensor.link.jax.dispatch import jax_typify

            cell[0] = jax_typify(value)


def dumps_cores(obj):
    """``pickle.dumps`` of function cores, whose compiled functions load with
    ``_load_function``."""
    from pytensor.compile import Function

    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = copyreg.dispatch_table.copy()
    pickler.dispatch_table[Function] = _reduce_function
    pickler.dump(obj)
    return buf.getvalue()


def _reduce_function(fn):
    _, args = copyreg.dispatch_table[type(fn)](fn)
    return _load_function, args


def _load_function(maker, input_storage, inputs_data, trust_input=False):
    """Link a pickled PyTensor function again, as PyTensor's own loader does, but
    without its check that every input still holds the pickled value: the JAX
    backend replaces a generator input by a fresh copy in JAX's form (a dict of
    arrays), and comparing dicts of arrays raises.  (See ``compile_function``
    for the backend's warning about that copy.)"""
    del inputs_data
    with compiler_warnings_hidden(maker.linker):
        fn = maker.create(input_storage)
    fn.trust_input = trust_input
    return fn
