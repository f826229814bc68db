"""Likelihoods written as potentials: ``pm.Potential("ll", pm.math.sum(<one
value per row>))``, as older tutorials and custom likelihoods do.  Such a
potential is split like an observed variable: its per-row values are the
term, its rows those of the data it reads (``check_rowwise`` then proves the
rows independent, as for any term)."""

__all__ = ["per_row", "potential_rows", "row_potentials", "sums_over_rows"]


def sums_over_rows(potential):
    """Whether ``potential`` is a sum, over every axis, of values with rows."""
    from pytensor.tensor.math import Sum

    node = potential.owner
    if node is None or not isinstance(node.op, Sum):
        return False
    x = node.inputs[0]
    return x.type.ndim >= 1 and (node.op.axis is None or sorted(node.op.axis) == list(range(x.type.ndim)))


def per_row(potential):
    """The values ``potential`` sums, one per row (summed over any other axes)."""
    if not sums_over_rows(potential):
        raise ValueError("potential %r is not a sum of one value per row (pm.math.sum(...) of row-wise "
                         "log-densities), so it cannot be split; leave it out of observed=" % potential.name)
    x = potential.owner.inputs[0]
    return x.sum(axis=tuple(range(1, x.type.ndim))) if x.type.ndim > 1 else x


def potential_rows(potential):
    """The rows of a potential that ``sums_over_rows``: the longest leading
    length of the data (constants, shared variables) it reads; None if none."""
    from pytensor.graph.traversal import ancestors

    from ._graphs import leading

    lengths = [leading(v) for v in ancestors([potential]) if v.owner is None]
    lengths = [n for n in lengths if n is not None]
    return max(lengths) if lengths else None


def row_potentials(model):
    """The potentials of ``model`` that sum over rows of data."""
    return [p for p in model.potentials if sums_over_rows(p) and potential_rows(p) is not None]

