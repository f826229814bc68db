"""How values of shared variables move between ranks for the collectives:
through the host (the exchange buffer and Data segments, one round trip), or
as device collectives that every rank runs (or queues) at once."""

from .._common.selections import selection_length, take_rows
from .._common.values import check_flag
from .._data import Data
from .._wire.exchange_buffer import unpack
from .._wire.protocol import Collective, GetShapes, SendShareds, SetShareds
from .targets import array_of, check_static

__all__ = ["gather_arrays", "set_all", "all_shapes", "shape_table", "equal_shapes", "uniform_shapes",
           "use_nccl", "device_collective"]


def _tokens(rt, values):
    """How workers on this host find each of ``values``: a Data by its segment,
    the arrays through the master's exchange buffer, all laid out in one send
    (see ``_wire.exchange_buffer``).  The caller releases the buffer once the command's
    round trip is over."""
    arrays = [v for v in values if not isinstance(v, Data)]
    packed = iter(rt.exchange.pack(arrays))
    return [v._ref() if isinstance(v, Data) else next(packed) for v in values]


def gather_arrays(rt, ids, ranks=None):
    """Values of shared variables ``ids`` from ``ranks`` (default all), as
    {rank: [arrays]}; worker arrays are views valid until their next send."""
    dev = rt.device
    m = rt.master_rank
    ranks = list(range(rt.n_parallel)) if ranks is None else ranks
    workers = [r for r in ranks if r != m]
    shared = rt.registry.shared
    local = (lambda: [dev.get_value(shared(i)) for i in ids]) if m in ranks else None
    message = SendShareds(ids) if workers else None  # get_value(master): only settles owed replies
    mine, replies = rt.dispatcher.request(message, ranks=workers, local=local)
    out = {r: unpack(tokens, rt.cache) for r, tokens in replies.items()}
    if m in ranks:
        out[m] = mine
    return out


def set_all(rt, variables, ids, values, rows=None, ranks=None, argname="values"):
    """Set shared variables on ``ranks`` (default all) to ``values``, taking
    ``rows[rank][k]`` (a selection or None) of value k on each rank.  Values that
    do not fit a variable's static shape raise TypeError naming ``argname``."""
    m = rt.master_rank
    ranks = list(range(rt.n_parallel)) if ranks is None else ranks

    def rows_of(rank):
        return [None] * len(ids) if rows is None else rows[rank]

    for r in ranks if rows is not None else ranks[:1]:  # without rows, every rank gets the same
        for var, v, sel in zip(variables, values, rows_of(r)):
            shape = array_of(v).shape
            check_static(var, shape if sel is None else (selection_length(sel),) + shape[1:], argname)
    if rt.cluster is not None and any(rt.remote(r) for r in ranks):
        # A round trip of its own: first.
        rt.publisher.publish([v._memory for v in values if isinstance(v, Data)])

    def payload(rank, tokens):
        if not rt.remote(rank):
            return SetShareds(list(zip(ids, tokens, rows_of(rank))))
        # Another host: Data from its own copy, arrays inline (only this rank's rows).
        return SetShareds([(i, v._ref(), s) if isinstance(v, Data) else (i, take_rows(v, s), None)
                           for i, v, s in zip(ids, values, rows_of(rank))])

    def local():
        for var, v, sel in zip(variables, values, rows_of(m)):
            rt.device.set_value(var, take_rows(array_of(v), sel))

    rt.registry.forget_shapes(ids)
    here = [r for r in ranks if r != m and not rt.remote(r)]
    try:
        tokens = _tokens(rt, values) if here else None
        payloads = {r: payload(r, tokens) for r in ranks if r != m}
        rt.dispatcher.request(payloads, ranks=sorted(payloads), local=local if m in ranks else None)
    finally:
        rt.exchange.release()  # the round trip is over: every rank has read its values


def all_shapes(rt, ids):
    """Shapes of shared variables ``ids`` on every rank: ``[var][rank]`` (and
    recorded for device collectives)."""
    dev = rt.device
    shared = rt.registry.shared
    mine, replies = rt.dispatcher.request(GetShapes(ids), local=lambda: [dev.shape(shared(i)) for i in ids])
    replies[rt.master_rank] = mine
    table = [[tuple(replies[r][k]) for r in range(rt.n_parallel)] for k in range(len(ids))]
    for i, per_rank in zip(ids, table):
        rt.registry.record_shapes(i, per_rank)
    return table


def shape_table(rt, variables, ids):
    """``[var][rank]`` shapes for a device collective: as recorded, unless unknown
    or the master's own value has changed shape since; then asked of every rank."""
    m = rt.master_rank
    shapes = rt.registry.shapes
    unknown = [i for var, i in zip(variables, ids)
               if shapes(i) is None or shapes(i)[m] != rt.device.shape(var)]
    if unknown:
        all_shapes(rt, unknown)
    return [shapes(i) for i in ids]


def equal_shapes(variables, shapes, what):
    for var, per_rank in zip(variables, shapes):
        if len(set(per_rank)) > 1:
            raise ValueError("cannot %s %s: its shapes differ between ranks: %s" % (what, var, per_rank))


def use_nccl(rt, nccl):
    """Whether to run the device's own collective (``nccl=True`` and it has one)."""
    check_flag(nccl, "nccl")
    return nccl and rt.device.has_collectives


def device_collective(rt, op, ids, args, reduce_op=None):
    """Queue device collective ``op`` on every rank; returns the master's result.
    Workers' replies are read later (``Dispatcher.post``).  Whatever the device
    cannot do (a dtype, ``reduce_op`` on it) is refused before any rank starts:
    once the workers have the command, the master's failure closes the session."""
    variables = [rt.registry.shared(i) for i in ids]
    rt.device.check_collective(variables, reduce_op)
    local = getattr(rt.device, op)
    return rt.dispatcher.post(Collective(op, ids, args), local=lambda: local(variables, *args))


def uniform_shapes(rt, variables, ids):
    """The one shape of each variable on every rank, for reductions."""
    table = shape_table(rt, variables, ids)
    equal_shapes(variables, table, "reduce")
    return [per_rank[0] for per_rank in table]


