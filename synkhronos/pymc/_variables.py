"""Which of a model's variables are split, and over how many rows (the
pipeline's first stage).

By default every observed variable is split, or, in a model that has none,
every potential that sums over rows of data; ``observed=`` names them instead.
The row count is the longest leading dimension of their data, unless ``rows=``
gives it; by default, the variables of another length are then left to this
process, as are those whose data are drawn at random at each evaluation
(``pm.Minibatch``), which ``observed=`` cannot name.

A potential is split where it is a likelihood written as one, as older
tutorials and custom likelihoods do: ``pm.Potential("ll", pm.math.sum(<one
value per row>))``.  Its per-row values are then the term (``_terms``), its
rows those of the data it reads (``_split`` then proves the rows independent,
as for any term).
"""

from .._graph.editing import data_leading
from .._graph.editing import leading as _leading

__all__ = ["row_count", "rows_of", "split_variables"]


def split_variables(model, observed, rows):
    """``(variables, rows)``: the variables of ``model`` to split, as
    ``data_parallel``'s ``observed`` and ``rows`` ask, and their row count."""
    chosen = _observed(model, observed)
    drawn = [rv for rv in chosen if _drawn(model, rv)]
    if drawn and (observed is not None or len(drawn) == len(chosen)):
        raise ValueError("observed variable %r: its data are drawn at random at each evaluation "
                         "(pm.Minibatch), so they have no rows to split; data_parallel splits all rows over "
                         "the ranks instead: give the model the whole data" % drawn[0].name)
    chosen = [rv for rv in chosen if rv not in drawn]  # (by default, left to this process)
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
        potentials = [p for p in model.potentials if _sums_over_rows(p) and _potential_rows(p) is not None]
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
        if rv in model.potentials and not _sums_over_rows(rv):
            raise ValueError("potential %r is not a sum of one value per row (pm.math.sum(...) of row-wise "
                             "log-densities), so it cannot be split; leave it out of observed=" % rv.name)
        out.append(rv)
    return out


def _drawn(model, rv):
    """Whether observed variable ``rv``'s value is drawn at random (it reads
    a generator: ``pm.Minibatch``), its rows changing at every evaluation."""
    from pytensor.graph.traversal import graph_inputs
    from pytensor.tensor.random.type import RandomType

    value = model.rvs_to_values.get(rv)
    return value is not None and any(isinstance(v.type, RandomType) for v in graph_inputs([value]))


def _check_rows(rows):
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError("rows must be a positive int, got %r" % (rows,))
    return rows


def _sums_over_rows(potential):
    """Whether ``potential`` is a sum, over every axis, of values with rows."""
    from pytensor.tensor.math import Sum

    node = potential.owner
    if node is None or not isinstance(node.op, Sum):
        return False
    x = node.inputs[0]
    return x.type.ndim >= 1 and (node.op.axis is None or sorted(node.op.axis) == list(range(x.type.ndim)))


def _potential_rows(potential):
    """The rows of a potential that ``_sums_over_rows``: the longest leading
    length of the data (constants, shared variables) it reads; None if none."""
    from pytensor.graph.traversal import ancestors

    lengths = [_leading(v) for v in ancestors([potential]) if v.owner is None]
    lengths = [n for n in lengths if n is not None]
    return max(lengths) if lengths else None


def rows_of(model, var):
    """The rows of observed variable (or row-sum potential) ``var``, or None."""
    if var in model.potentials:
        return _potential_rows(var)
    value = model.rvs_to_values[var]
    return _leading(value) if value.owner is None else data_leading(value)


def row_count(model, observed):
    """The model's row count: the longest leading dimension of the observed
    values (those of ``observed``)."""
    lengths = [rows_of(model, rv) for rv in observed]
    lengths = [n for n in lengths if n is not None]
    if not lengths:
        raise ValueError("the model has no observed data with rows to split (observed: %s)"
                         % ", ".join(repr(rv.name) for rv in observed))
    return max(lengths)
