"""Which of a model's variables are split, and over how many rows (the
pipeline's first stage).

By default every observed variable is split, or, in a model that has none,
every potential that sums over rows of data (``_potentials``); ``observed=``
names them instead.  The row count is the longest leading dimension of their
data, unless ``rows=`` gives it; by default, the variables of another length
are then left to this process.
"""

from ._graphs import leading as _leading
from ._potentials import potential_rows, row_potentials

__all__ = ["row_count", "rows_of", "split_variables"]


def split_variables(model, observed, rows):
    """``(variables, rows)``: the variables of ``model`` to split, as
    ``data_parallel``'s ``observed`` and ``rows`` ask, and their row count."""
    chosen = _observed(model, observed)
    n_rows = row_count(model, chosen) if rows is None else _check_rows(rows)
    if observed is None:
        chosen = [rv for rv in chosen if rows_of(model, rv) == n_rows]
    return chosen, n_rows


def _observed(model, observed):
    """The observed variables (or row-sum potentials) that ``observed`` names;
    by default every observed variable, else every row-sum potential."""
    if observed is None:
        if model.observed_RVs:
            return list(model.observed_RVs)
        potentials = row_potentials(model)
        if potentials:
            return potentials
        raise ValueError("model has no observed variables, nor a potential that sums over rows of data: "
                         "nothing to split")
    if isinstance(observed, str) or not isinstance(observed, list | tuple):
        raise TypeError("observed must be a list of names or variables, got %r" % (observed,))
    out = []
    for v in observed:
        rv = model[v] if isinstance(v, str) and v in model.named_vars else v
        if rv not in model.observed_RVs and rv not in model.potentials:
            raise ValueError("observed: %r is not an observed variable or potential of the model (those are "
                             "%s)" % (v, [r.name for r in model.observed_RVs + model.potentials]))
        out.append(rv)
    return out


def _check_rows(rows):
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError("rows must be a positive int, got %r" % (rows,))
    return rows


def rows_of(model, var):
    """The rows of observed variable (or row-sum potential) ``var``, or None."""
    if var in model.potentials:
        return potential_rows(var)
    return _leading(model.rvs_to_values[var])


def row_count(model, observed):
    """The model's row count: the longest leading dimension of the observed
    values (those of ``observed``)."""
    lengths = [rows_of(model, rv) for rv in observed]
    lengths = [n for n in lengths if n is not None]
    if not lengths:
        raise ValueError("the model has no observed data with rows to split (observed: %s)"
                         % ", ".join(repr(rv.name) for rv in observed))
    return max(lengths)
