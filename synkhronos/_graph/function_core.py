"""The part of a Synkhronos function that every rank holds: compiling and
caching its variants (running a rank's share of a call is ``_call.share``).

A ``FunctionCore`` holds the compiled PyTensor function and the symbolic graph it
came from.  Variants that a call may need (an output subset, slicing with
accumulated updates, ``batch_s`` on sliceable shared variables) are compiled from
that graph on first use, in whichever process needs them.  Cores are pickled
together at ``distribute()`` (``_wire.pickling``), so the shared variables of all
functions keep their correspondence in every worker.
"""

import copy

import numpy as np

from .._common.compiler_warnings import compiler_warnings_hidden
from .._common.selections import sub_selection

__all__ = ["FunctionCore", "compile_function", "is_jax_mode", "links_with_jax", "reseed_generators",
           "uses_jax"]


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
        self.plain_key = (self.full_subset, False, None)  # the variant that every call could use
        self._variants = {self.plain_key: plain}
        # What ``variant`` returns, by key: the compiled function, wrapped for JAX.
        self._callables = {}
        self._reductions = {}  # (subset, device's reduce dtypes) -> device_reduction's answer

    @property
    def plain(self):
        return self._variants[self.plain_key]

    def compiled_variants(self):
        """``{key: PyTensor function}`` of the variants compiled so far."""
        return dict(self._variants)

    def __getstate__(self):
        state = self.__dict__.copy()
        # Only the plain function travels; the others are re-made where needed.
        state["_variants"] = {self.plain_key: self._variants[self.plain_key]}
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
            from . import jax_reductions, jax_shapes  # noqa: F401  (register the rewrites the mode names)
        kwargs = dict(self.kwargs)
        kwargs.setdefault("on_unused_input", "ignore")
        return compile_function(ins, outs, updates=updates, givens=givens, **kwargs)

    def variant_key(self, subset, slices, share_sel):
        """The key ``(subset, accumulate, share_kind)`` of the variant that runs
        a share in ``slices`` slices (``_call.share.share_rows`` decides how
        many); ``compiled(*key)`` builds it.  The master asks before a call
        whether the variant ran yet, every rank when it runs its share."""
        if slices > 1:
            return subset, bool(self.updates), self.sliced_kind(share_sel)
        return subset, False, self.share_args(share_sel, None)[0]

    def sliced_kind(self, share_sel):
        if not self.sliceable:
            return None
        return "index" if self.index_only or isinstance(share_sel, np.ndarray) else "slice"

    def share_args(self, share_sel, part):
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

    # ------------------------------------------------------------ reductions
    def reduction_specs(self, subset, reduce_dtypes):
        """``(shape, dtype, mode)`` per output of ``subset`` when a device that
        reduces ``reduce_dtypes`` can reduce them itself, else None (see
        ``_call.share.device_reduction``); cached, since every rank asks on every call."""
        key = (subset, reduce_dtypes)
        if key not in self._reductions:
            self._reductions[key] = self._reduction_specs(subset, reduce_dtypes)
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


def uses_jax(cores):
    """Whether any of function cores ``cores`` was linked by PyTensor's JAX linker."""
    return any(type(core.plain.maker.linker).__name__ == "JAXLinker" for core in cores)


def links_with_jax(mode):
    """Whether ``pytensor.function(..., mode=mode)`` links with the JAX linker
    (``mode`` None: PyTensor's default mode, which a flag may make JAX)."""
    from pytensor.compile.mode import get_mode

    return type(get_mode(mode).linker).__name__ == "JAXLinker"


def is_jax_mode(mode):
    """Whether ``mode`` (a name, a Mode or None) links with PyTensor's JAX linker."""
    if mode is None:
        return False
    if isinstance(mode, str):
        return mode.upper() == "JAX"
    return type(getattr(mode, "linker", None)).__name__ == "JAXLinker"


def _reseeded(value, rank):
    """A generator for ``rank`` derived from numpy ``Generator`` ``value``; None
    for any other value."""
    if not isinstance(value, np.random.Generator):
        return None
    entropy = [int(e) for e in copy.deepcopy(value).integers(0, 2**63, size=4)]
    seq = np.random.SeedSequence(entropy, spawn_key=(rank,))
    return np.random.Generator(type(value.bit_generator)(seq))


def reseed_generators(shareds, cores, rank, known=()):
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
    done = {id(var.container.storage) for var in known}  # reseeded when they were distributed
    for core in filter(None, cores):  # (None: a function distribute() could not send)
        for fn in core._variants.values():
            for inp, container in zip(fn.maker.inputs, fn.input_storage):
                if isinstance(container.storage[0], dict):
                    jax_copies.append((container.storage, inp.variable))
                else:
                    cells.append(container.storage)
    for cell in {id(c): c for c in cells if id(c) not in done}.values():  # a cell shared by functions once
        new = _reseeded(cell[0], rank)
        if new is not None:
            cell[0] = new
    for cell, var in jax_copies:
        value = var.container.storage[0]
        if isinstance(value, np.random.Generator):
            from pytensor.link.jax.dispatch import jax_typify

            cell[0] = jax_typify(value)
