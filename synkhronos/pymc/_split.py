"""The terms' rows split among the ranks, proved first (the pipeline's third
stage).

Each rank will hold one contiguous share of the rows (``bounds``, as
``synk.scatter`` splits them).  ``check_rowwise`` proves on the model's initial
point that the terms allow it: each share computed alone must give the same
per-row values as all rows together.  A term that couples rows (an AR process,
a GP, a cumulative sum) fails there with an error naming it, instead of giving
a wrong number.
"""

import numpy as np

from .._graph.editing import replaced as _replaced
from .._graph.editing import row_input as _row_input
from .._graph.editing import value_of as _value_of

__all__ = ["JITTER_SEED", "check_rowwise", "initial_inputs"]

JITTER_SEED = 0  # the jittered point's seed: the same point, so the same choices, in every run


def check_rowwise(model, terms, bounds):
    """Raise ValueError unless each term's per-row log-density, computed on the
    rows ``bounds`` (a list of (start, stop)) one part at a time, equals the same
    rows computed with all of them, at the model's initial point."""
    whole, parts = _per_row_values(model, terms, bounds)
    rows = bounds[-1][1]
    for k, rv in enumerate(terms.observed):
        full = np.asarray(whole[k])
        if full.ndim == 0 or full.shape[0] != rows:
            raise ValueError(
                "%s: its log-density has shape %s, not one value per row (%d rows); "
                "a likelihood over all rows at once (multivariate, AR, GP...) cannot be split "
                "(leave it out of observed=)" % (_kind(model, rv), full.shape, rows))
        joined = np.concatenate([np.asarray(p[k]) for p in parts])
        tol = 1e-4 if full.dtype == np.float32 else 1e-9
        if joined.shape != full.shape or not np.allclose(joined, full, rtol=tol, atol=tol, equal_nan=True):
            worst = np.max(np.abs(joined - full)) if joined.shape == full.shape else joined.shape
            raise ValueError(
                "%s: each row's log-density depends on other rows (computed on the "
                "ranks' shares it differs from all rows at once by %s), so its rows cannot be split "
                "(leave it out of observed=)" % (_kind(model, rv), worst))


def _per_row_values(model, terms, bounds):
    """``(whole, parts)``: each term's per-row log-density at the model's initial
    point, computed on all rows at once, and on each share of ``bounds``."""
    import pytensor

    inputs = [v.type() for v in terms.params + terms.data] + [_row_input(v, v.name) for v in terms.row_vars]
    logps = _replaced(terms.logps, dict(zip(terms.held + terms.data + terms.row_vars, inputs)))
    fn = pytensor.function(inputs, logps, mode="FAST_COMPILE", on_unused_input="ignore")
    head = initial_inputs(model, terms)
    whole = fn(*head, *terms.row_values)
    try:
        parts = [fn(*head, *[val[a:b] for val in terms.row_values]) for a, b in bounds]
    except Exception as exc:  # a term that reads rows of another length (PyTensor's or numpy's error)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(
            "%s: the log-density cannot be computed on part of the rows (%s: %s): its graph fixes the "
            "number of rows or reads data of another length; leave it out of observed="
            % (terms.names(), type(exc).__name__, first)) from exc
    return whole, parts


def _kind(model, var):
    return "%s %r" % ("potential" if var in model.potentials else "observed variable", var.name)


def initial_inputs(model, terms, jitter=False):
    """The terms' parameters at the model's initial point, then their data: the
    inputs of one point, in the order the ranks' graph takes them.

    ``jitter``: at that point jittered as ``pm.sample`` starts its chains
    (uniform in (-1, 1) added to each transformed value; a fixed seed), for
    timing: a graph's time may depend on its values (PyTensor's Numba softplus
    branches on each value, and at the initial point every row takes the same
    branch: a logistic GLMM ran 4.1 ms there against 7.2 ms at a jittered point)."""
    params = []
    if terms.params:
        fn = model.compile_fn(model.replace_rvs_by_values(terms.params), inputs=model.value_vars,
                              mode="FAST_COMPILE", on_unused_input="ignore")
        params = [np.asarray(x) for x in fn(_jittered(model) if jitter else model.initial_point())]
    return params + [np.asarray(_value_of(v)) for v in terms.data]


def _jittered(model):
    """The model's initial point with its continuous variables jittered (PyMC
    jitters only those); where it cannot be made, the initial point."""
    from pymc.initial_point import make_initial_point_fn

    continuous = {rv for rv in model.free_RVs if rv.type.dtype.startswith("float")}
    try:
        return make_initial_point_fn(model=model, jitter_rvs=continuous, return_transformed=True)(JITTER_SEED)
    except Exception:  # (an initial value PyMC cannot jitter: nothing to time there that the point lacks)
        return model.initial_point()
