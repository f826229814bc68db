"""Where each evaluation runs (the pipeline's twelfth stage): on every rank,
each with its share of the rows, or on this process's rank alone, holding
every row, where that is faster.

An evaluation on every rank pays a round trip to the other ranks and a
reduction of their results; each rank's share of the rows saves the time of
the rest.  Where rows are few, or a call holds few points, the round trip can
cost more than it saves (on four GPUs: one point at ten million rows, but not
four points).  ``placed`` measures, as they run, at the model's initial point,
for one point and (where chains are batched) four:

1. every rank with its share: ``t_all``;
2. this process's rank alone on its share: ``t_share``.  All rows cost at
   least that, so where ``t_all`` is within ``MARGIN`` of it at every size,
   the round trip costs next to nothing: every call goes to every rank;
3. otherwise, if all rows fit in ``TRIAL_BYTES``, this rank alone with a copy
   of every row (a function of its own, ``alone``): ``t_alone``.  Calls of up
   to the largest number of points at which it was faster by ``MARGIN``
   (and at every smaller size timed) go to it, the others to every rank;
   where it was never faster, its rows are dropped.

The rows on every rank stay as they were: ``pm.compute_log_likelihood`` and
``loo`` read them there.  ``ranks=1`` instead gives every row to this rank
(the others keep none), and every call runs there.  The log says what was
chosen and the times it rests on.
"""

import dataclasses
import logging
import os

from .. import _collectives as _coll
from .._session import runtime
from ._distribute import distributed
from ._evaluator import timed as _timed
from ._evaluator import times_text as _times

__all__ = ["MARGIN", "RANKS_ENV", "TRIAL_BYTES", "check_ranks", "placed", "rows_on"]

logger = logging.getLogger("synkhronos")

MARGIN = 1.1  # how much faster one placement must measure to be taken over the other
TRIAL_BYTES = 1 << 30  # the most rows copied to this process's rank to time it alone
RANKS_ENV = "SYNKHRONOS_PYMC_RANKS"  # ``ranks``' default where not given: "all", "1", or unset (timed)
_EVERY = float("inf")


def check_ranks(ranks, n_parallel):
    """``ranks`` as ``data_parallel`` takes it (None, 1 or ``n_parallel``),
    None taking ``$SYNKHRONOS_PYMC_RANKS`` where that is set."""
    if ranks is None:
        return _ranks_from_env(n_parallel)
    if type(ranks) is int and ranks in (1, n_parallel):
        return ranks
    raise ValueError("ranks must be None (chosen by timing), 1 (this process's rank alone) or %d "
                     "(every rank), got %r" % (n_parallel, ranks))


def _ranks_from_env(n_parallel):
    text = os.environ.get(RANKS_ENV, "").strip().lower()
    if not text:
        return None
    if text not in ("all", "1"):
        raise ValueError("%s must be 'all' (every rank) or '1' (this process's rank alone), got %r"
                         % (RANKS_ENV, os.environ[RANKS_ENV]))
    return 1 if text == "1" else n_parallel


def rows_on(ranks):
    """The rank that ``distributed`` gives every row for ``ranks`` (as
    ``check_ranks`` returns it): this process's where ``ranks`` is 1 and there
    are others, else None (scattered over every rank)."""
    rt = runtime.require()
    return rt.master_rank if ranks == 1 and rt.n_parallel > 1 else None


def placed(served, graph, terms, point, ranks):
    """Route ``served``'s calls (the ``Evaluator`` of ``graph``, whose rows
    ``distributed`` placed as ``rows_on(ranks)`` says) to every rank or to this
    process's rank alone: as ``ranks`` says (1 or the number of ranks), or, for
    None, as measured.  Returns a line for the log: where the calls go."""
    n = runtime.require().n_parallel
    if n == 1 or ranks == n:
        return "on %d rank%s" % (n, "s" * (n > 1))
    if ranks == 1:  # every row already here (``rows_on``), the others' rows empty as built
        served.run_alone(served.fn)
        served.alone_rows = graph.rows
        return "on this process's rank alone"
    try:
        return _timed_choice(served, graph, terms, point, n)
    except Exception as exc:  # (at the initial point the graph may raise; evaluations will say why)
        served.run_alone(None)
        logger.warning("synkhronos.pymc: %s: not timed (%s: %s); every call on %d ranks",
                       graph.names, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "", n)
        return "on %d ranks" % n


def _timed_choice(served, graph, terms, point, n):
    """Time the placements (see the module's docstring) at ``point`` (the
    model's initial point); route by the times."""
    sizes = (1, 4) if served.batched else (1,)
    t_all = _timed(served, point, sizes)
    served.run_alone(served.fn)  # this rank's share only: the workers hold theirs, untouched
    t_share = _timed(served, point, sizes)
    served.run_alone(None)
    size = sum(v.nbytes for v in terms.row_values)
    if all(t_all[k] <= MARGIN * t_share[k] for k in sizes) or size > TRIAL_BYTES:
        why = ("this rank's share alone: %s" % _times(t_share) if size <= TRIAL_BYTES else
               "%.1f GB of rows, over the %.1f GB timed on one rank" % (size / 1e9, TRIAL_BYTES / 1e9))
        logger.info("synkhronos.pymc: %s on %d ranks: %s (%s)", graph.names, n, _times(t_all), why)
        return "on %d ranks" % n
    alone, served.alone_rows = _alone_function(graph, terms.row_values)
    served.run_alone(alone)
    t_alone = _timed(served, point, sizes)
    up_to = 0
    for k in sizes:
        if not t_alone[k] * MARGIN < t_all[k]:
            break
        up_to = k
    up_to = _EVERY if up_to == sizes[-1] else up_to
    served.run_alone(alone if up_to else None, up_to)
    logger.info("synkhronos.pymc: %s: %s on this process's rank alone against %s on %d ranks: evaluated %s",
                graph.names, _times(t_alone), _times(t_all), n, _routes(up_to, n))
    if not up_to:
        _coll.set_value(runtime.require().master_rank, served.alone_rows, [v[:0] for v in terms.row_values])
    return _routes(up_to, n)


def _alone_function(graph, row_values):
    """``(function, rows)``: ``graph``'s function over rows of its own (their
    shared variables), every one of them on this process's rank."""
    import pytensor
    from pytensor.graph.replace import clone_replace

    own = [pytensor.shared(r.get_value(borrow=True)[:0], name=r.name, shape=r.type.shape) for r in graph.rows]
    outputs = clone_replace(list(graph.outputs), replace=dict(zip(graph.rows, own)))
    alone = dataclasses.replace(graph, rows=own, outputs=outputs)
    return distributed(alone, row_values, on=runtime.require().master_rank), own


def _routes(up_to, n):
    if up_to == _EVERY:
        return "on this process's rank alone (data_parallel(..., ranks=%d) shares the work)" % n
    if up_to:
        return "on this process's rank alone up to %d point%s a call, on %d ranks for more" % (
            up_to, "s" * (up_to > 1), n)
    return "on %d ranks" % n
