"""What ``synkhronos.pymc.loo`` needs of a ``data_parallel`` copy, kept on its
Op: each split term's log-density per row, written in the ranks' own inputs.

Those inputs are the ranks' graph's (``_ranks``): a placeholder per free
variable, one per data input without rows, and the shared variables that
already hold each rank's rows (scattered once by ``_distribute``).  ``loo``
builds another Synkhronos function on the same shared variables, so the rows
are not sent again.  Only graphs are kept: the rows' values, which ``RowTerms``
holds in this process, are not (they can be as large as the data set).
"""

import dataclasses

from .._graph.editing import replaced as _replaced

__all__ = ["PointwiseTerms", "pointwise_terms"]


@dataclasses.dataclass(frozen=True, eq=False)  # graphs compare by identity
class PointwiseTerms:
    """The split terms of one copy, per row.

    ``names``: each term's variable (observed variable or potential);
    ``params``, ``data``, ``rows``: the ranks' graph's inputs of one point
    (``RanksGraph``'s), ``rows`` the shared variables that hold each rank's
    rows; ``logps``: per term, its log-density with one value per row (and any
    axes that follow, for an observed value of more than one axis), in those
    inputs, PyMC's parameter checks not compiled; ``dims``: per term, the
    names the model gave its axes (``dims=``), or None.
    """

    names: tuple
    dims: tuple
    params: list
    data: list
    rows: list
    logps: list

    def param_names(self):
        return [p.name for p in self.params]


def pointwise_terms(model, terms, graph):
    """The ``PointwiseTerms`` of ``terms`` (a ``RowTerms`` of ``model``) in the
    inputs of ``graph`` (their ``RanksGraph``)."""
    replace = dict(zip(terms.held + terms.data + terms.row_vars, graph.params + graph.data + graph.rows))
    return PointwiseTerms(names=tuple(rv.name for rv in terms.observed),
                          dims=tuple(model.named_vars_to_dims.get(rv.name) for rv in terms.observed),
                          params=list(graph.params),
                          data=list(graph.data), rows=list(graph.rows), logps=_replaced(terms.logps, replace))
