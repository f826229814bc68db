"""The ranks' graph made a Synkhronos function and sent to the ranks with their
rows (the pipeline's ninth stage).

The function broadcasts the parameters (and the data without rows) on every
call, and each rank sums its outputs over its own rows: one reduction returns
the total.  The rows themselves are scattered once, here, into the function's
shared variables, each rank keeping only its share.
"""

import logging

from .. import _api, _data, _function
from .. import _collectives as _coll
from .._session import runtime

__all__ = ["distributed", "place_rows"]

logger = logging.getLogger("synkhronos")


def distributed(graph, row_values, on=None):
    """The Synkhronos function of ``graph`` (a ``RanksGraph``), distributed,
    with ``row_values`` (the values of ``graph.rows``) scattered over the
    ranks, or all given to rank ``on``; ``row_values`` None: the rows are
    where an earlier function of the same shared variables placed them."""
    mode = {} if graph.mode is None else {"mode": graph.mode}
    fn = _function.function([], [(o, "sum") for o in graph.outputs], bcast_inputs=graph.inputs + graph.data,
                            name="pymc rows of %s" % graph.names, **mode)
    _distribute(fn, graph.names)
    if row_values is not None:
        place_rows(graph.rows, row_values, on)
    return fn


def place_rows(rows, values, on=None):
    """Set ``rows`` (shared variables) to ``values``: scattered over every rank
    (``on`` None), or all on rank ``on``.  Values that other ranks read pass
    through ``synkhronos.Data`` freed at once: through the session's exchange
    buffer, a buffer as large as the rows would stay in this process."""
    rt = runtime.require()
    if on == rt.master_rank or rt.n_parallel == 1:
        _coll.set_value(rt.master_rank, rows, values)
        return
    datas = [_data.data(v) for v in values]
    try:
        if on is None:
            _coll.scatter(rows, datas)
        else:
            _coll.set_value(on, rows, datas)
    finally:
        for d in datas:
            d.free_memory()


def _distribute(fn, names):
    """``distribute()``, raising ValueError if ``fn`` (the function of the terms
    ``names``) could not be sent; if another function of the session could not,
    its calls raise."""
    try:
        _api.distribute()
    except TypeError as exc:
        if runtime.require().registry.refusal(fn._core.ID) is None:
            logger.warning("synkhronos.pymc: %s", exc)
            return
        raise ValueError("observed %s: its log-density graph cannot be sent to the ranks (%s); leave it "
                         "out of observed= to compute it in this process" % (names, exc)) from exc
