"""The ranks' side of ``synkhronos.pymc.loo``: each rank's rows, a block at a
time, at every draw, Pareto-smoothed on the rank.

Two Synkhronos functions, called one after the other for each block:

- ``loglik``: a term's per-row log-density at every draw (the draws, data,
  ``reff`` and chains in shared variables broadcast once per ``loo``), for
  the block of each rank's rows that ``batch_s`` selects, kept on the rank in
  a shared variable, one row per row and one column per draw (``update``);
  compiled as the ranks compile by default (JAX);
- ``smooth``: the PSIS of each row of that (``_psis``: ArviZ's numbers, on
  the GPU on GPU ranks), which returns each row's ``elpd_loo``, ``p_loo`` and
  Pareto k.

Why two: under JAX a CPU rank's ``jax.pure_callback`` waited forever for its
own input once the block reached a few MB (JAX 0.10: the copy of the input
queued behind the computation that waits for the callback), and PyTensor's
Python linker, which runs the Op as it is, computes a log-density a hundred
times slower than JAX (``softplus`` one element at a time).  So ``smooth``
runs with the Python linker on CPU ranks and with JAX on GPU ranks, their only
linker, where the block is smoothed on the GPU and a callback takes only a
block's odd rows to ArviZ (its input comes from the GPU: nothing on the host's
queue waits for it).
"""

import numpy as np

from .. import _api, _function
from .. import _collectives as _coll
from .._session import runtime
from ._gradient import parameter_checks

__all__ = ["RanksLoo", "over_draws"]


class RanksLoo:
    """Term ``term`` of ``terms`` (a copy's ``PointwiseTerms``) on the ranks,
    its parameter checks compiled as ``check_bounds`` asks.

    ``params`` and ``data``: which of ``terms``' parameters and data the term
    reads (indices); ``shareds``: the shared variables to broadcast before a
    ``loo``, their draws, the data, ``reff`` and the number of chains."""

    def __init__(self, terms, term, check_bounds):
        import pytensor
        from pytensor.graph.replace import clone_replace
        from pytensor.graph.traversal import graph_inputs

        from ._psis import PointwiseLoo

        self.name = terms.names[term]
        # On a copy: the checks are rewritten in place, and the copy's graph stays for other terms.
        (logp,) = parameter_checks(clone_replace([terms.logps[term]]), check_bounds)
        read = set(graph_inputs([logp]))
        self.params = [i for i, p in enumerate(terms.params) if p in read]
        self.data = [i for i, d in enumerate(terms.data) if d in read]
        self.rows = [r for r in terms.rows if r in read]
        if not self.rows:
            raise ValueError("the log-density of %r reads no rows of data: nothing to leave out" % self.name)
        params = [terms.params[i] for i in self.params]
        data_in = [terms.data[i] for i in self.data]
        draws = [_shared((None,) + p.type.shape, p.dtype, "loo draws:%s" % p.name) for p in params]
        data = [_shared(d.type.shape, d.dtype, "loo data:%s" % d.name) for d in data_in]
        reff = pytensor.shared(np.float64(1.0), name="loo reff")
        chains = pytensor.shared(np.int64(1), name="loo chains")
        self.shareds = draws + data + [reff, chains]
        loglik = over_draws(logp, params, draws, dict(zip(data_in, data)))  # draws x rows x ...
        # Rows first, draws last: the block is selected by its rows, and ArviZ reads each row's draws.
        by_row = loglik.transpose(list(range(1, loglik.ndim)) + [0])
        block = _shared((None,) * by_row.ndim, by_row.dtype, "loo block:%s" % self.name)
        self.loglik = _function.function([], updates=[(block, by_row)], sliceable_shareds=self.rows,
                                         name="pymc loo rows of %s" % self.name)
        outputs = PointwiseLoo()(block, reff, chains)
        self.smooth = _function.function([], [(o, None) for o in outputs], sliceable_shareds=[block],
                                         name="pymc loo of %s" % self.name, **_smoothing_mode())
        _distribute([self.loglik, self.smooth], self.name)
        self.lengths = list(_coll.get_lengths(self.rows[0]))

    def run(self, chunk):
        """``(elpd_i, p_loo_i, k_i)`` of every rank's rows, in the order of the
        rows, ``chunk`` rows of each rank at once."""
        parts = [[[], [], []] for _ in self.lengths]
        for start in range(0, max(self.lengths), chunk):
            sels = [slice(min(start, n), min(start + chunk, n)) for n in self.lengths]
            self.loglik(batch_s=sels)  # a rank without rows left keeps its block, and smooth skips it
            results = self.smooth(batch_s=[slice(0, s.stop - s.start) for s in sels])
            had = [r for r, s in enumerate(sels) if s.stop > s.start]
            for out, values in enumerate(results):
                for r, v in zip(had, values):
                    parts[r][out].append(np.asarray(v))
        return tuple(np.concatenate([p for rank in parts for p in rank[out]]) for out in range(3))


def over_draws(logp, params, draws, data):
    """``logp`` (one value per row) at every draw, draws first: vectorized
    where PyTensor can, else a loop over the draws (``scan``); ``data``
    replaces data inputs."""
    import pytensor
    from pytensor.graph.replace import clone_replace, vectorize_graph

    logp = clone_replace(logp, data) if data else logp
    try:
        return vectorize_graph(logp, replace=dict(zip(params, draws)))
    except Exception:  # an Op without a batched form: one draw at a time
        # (PyTensor 2.38 and 3.3 both return the updates unless told not to.)
        return pytensor.scan(lambda *point: clone_replace(logp, dict(zip(params, point))), sequences=draws,
                             return_updates=False)


def _smoothing_mode():
    """``smooth``'s linker (see the module docstring): JAX on GPU ranks (their
    default), PyTensor's Python linker on CPU ranks."""
    from pytensor.compile.mode import Mode

    if runtime.require().device.name == "gpu":
        return {}
    return {"mode": Mode(linker="py", optimizer="fast_run")}


def _shared(shape, dtype, name):
    """A shared variable of static ``shape`` (None: any length), its value
    filled in by a broadcast or an update later."""
    import pytensor

    return pytensor.shared(np.zeros(tuple(1 if n is None else n for n in shape), dtype=dtype), name=name,
                           shape=shape)


def _distribute(fns, name):
    """``distribute()``, raising ValueError if one of ``fns`` could not be sent."""
    try:
        _api.distribute()
    except TypeError as exc:
        registry = runtime.require().registry
        if all(registry.refusal(fn._core.ID) is None for fn in fns):
            return  # another function of the session was refused; its calls raise
        raise ValueError("the log-density of %r cannot be sent to the ranks for loo (%s)"
                         % (name, exc)) from exc
