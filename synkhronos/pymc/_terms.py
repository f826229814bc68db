"""A PyMC model's row terms (the pipeline's second stage): for each variable
split, its log-density as a sum over rows of data, and the inputs that
log-density reads, each by its role.

A term is split when its observed value has the model's row count ``rows`` in
its leading dimension.  Its log-density (PyMC's, one value per row) is then
rebuilt with placeholders:

- each free random variable it depends on becomes a broadcast input (the
  parameters, sent on every evaluation);
- each observed value, ``pm.Data`` or constant with ``rows`` rows becomes a
  shared variable that holds one rank's rows (split once);
- other ``pm.Data`` become broadcast inputs too, so ``pm.set_data`` on them
  reaches the ranks.

Rows picked by a constant index are taken from the data instead of the
results.  PyMC imputes missing observed values by splitting the variable in
two: the observed part is the full-length graph indexed by a constant mask, as
in ``(b * x)[mask]``.  Split as it is, every rank would compute ``b * x`` over
all rows and index its share of the mask into rows it does not hold.  Pushed
down to the data, ``b * x[mask]``, the selected rows are data of the term's own
length, split like any other.  Only elementwise operations, a matrix product's
rows and further constant indexing are looked through; anything else stays as
written.

The rows are then held in as few bytes as their values allow (``_rowdata``).

Whether the rows can in fact be split is proved next (``_split``, which
refuses such a term, naming it).
"""

import numpy as np

from .._graph.editing import array_indexing, data_leading
from .._graph.editing import leading as _leading
from .._graph.editing import replaced as _replaced
from .._graph.editing import row_input as _row_input
from .._graph.editing import value_of as _value_of
from ._rowdata import held_compactly

__all__ = ["RowTerms", "find_terms"]


class RowTerms:
    """What ``find_terms`` found.

    Attributes
    ----------
    observed : list of Variable
        The observed random variables whose terms are split.
    params : list of Variable
        The model's free random variables those terms depend on.
    held : list of Variable
        The inputs that stand for them in ``logps``.
    data : list of Variable
        Shared variables without ``rows`` rows that the terms read.
    row_vars : list of Variable
        The values with ``rows`` rows: observed values, ``pm.Data``, constants.
    row_values : list of numpy arrays
        Their values, in the same order.
    logps : list of Variable
        Each term's per-row log-density, in terms of the variables above.
    """

    def __init__(self, observed, params, held, data, row_vars, row_values, logps):
        self.observed = observed
        self.params = params
        self.held = held
        self.data = data
        self.row_vars = row_vars
        self.row_values = row_values
        self.logps = logps

    def names(self):
        return ", ".join(repr(v.name) for v in self.observed)


def find_terms(model, observed, rows, merge=True):
    """The ``RowTerms`` of ``model``'s observed variables ``observed`` over
    ``rows`` rows (``merge``: as ``held_compactly`` takes it)."""
    # The free variables as plain inputs while PyMC derives each log-density:
    # its rewrites of measurable variables (Censored, say) clone the random
    # variables they meet, which would then no longer be the model's.
    holders = {rv: rv.type(name=rv.name) for rv in model.free_RVs}
    logps, stands, stand_values = _row_logps(model, observed, rows, holders)
    params, data, row_vars, row_values = _inputs_by_role(model, observed, rows, holders, logps, stands)
    logps, row_vars, row_values = held_compactly(logps, row_vars, row_values, keep=stands, merge=merge)
    return RowTerms(list(observed), params, [holders[p] for p in params], data,
                    stands + row_vars, stand_values + row_values, logps)


def _row_logps(model, observed, rows, holders):
    """Each of ``observed``'s per-row log-densities, its free variables replaced
    by ``holders``, and the inputs that stand for the observed values, with
    those values: ``(logps, stands, stand_values)``."""
    logps, stands, stand_values = [], [], []
    for rv in observed:
        if rv in model.potentials:
            (lp,) = _replaced([_per_row(rv)], holders)
        elif model.rvs_to_values[rv].owner is not None:  # a graph of data: its data are rows like any other
            value = model.rvs_to_values[rv]
            _check_rows(rv.name, data_leading(value), rows)
            lp = _observed_logp(_replaced([rv], holders)[0], value, rv.name)
        else:
            stand, stand_value = _stand_in(model.rvs_to_values[rv], rv.name, rows)
            stands.append(stand)
            stand_values.append(stand_value)
            lp = _observed_logp(_replaced([rv], holders)[0], stand, rv.name)
        _check_no_draws(lp, rv)
        logps.append(_free_of_row_count(_select_rows_in_data(lp, rows), rows))
    return logps, stands, stand_values


def _per_row(potential):
    """The values ``potential`` sums, one per row, summed over any other axes
    (``_variables`` chose it as a sum over rows)."""
    x = potential.owner.inputs[0]
    return x.sum(axis=tuple(range(1, x.type.ndim))) if x.type.ndim > 1 else x


def _stand_in(value, name, rows):
    """An input of any number of rows that stands for observed value ``value``
    (of variable ``name``), and the value itself, contiguous."""
    _check_rows(name, _leading(value), rows)
    stand = _row_input(value, name)
    return stand, np.ascontiguousarray(_value_of(value))


def _check_rows(name, found, rows):
    if found != rows:
        raise ValueError("observed variable %r has %s rows, not %d like the others: it cannot be "
                         "split with them (leave it out of observed=)" % (name, found, rows))


def _inputs_by_role(model, observed, rows, holders, logps, stands):
    """The graph inputs of ``logps`` by role: ``(params, data, row_vars,
    row_values)``, the free variables (in the model's order) whose ``holders``
    they read, the shared variables without ``rows`` rows, and the shared
    variables and constants with ``rows`` rows (``stands`` aside) with their
    values."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import ancestors

    params, data, row_vars, row_values = [], [], [], []
    of_holder = {h: rv for rv, h in holders.items()}
    for v in (v for v in ancestors(logps) if v.owner is None):
        if v in of_holder:
            params.append(of_holder[v])
        elif v in stands:
            continue
        elif v in model.observed_RVs:
            raise ValueError("the log-density of %s depends on observed variable %r: not supported"
                             % (", ".join(repr(rv.name) for rv in observed), v.name))
        elif _is_generator(v):
            continue  # a generator the rebuilt variable holds: a log-density never draws from it
        elif isinstance(v, SharedVariable | Constant) and _leading(v) == rows:
            row_vars.append(v)
            row_values.append(np.ascontiguousarray(_value_of(v)))
        elif isinstance(v, SharedVariable):
            data.append(v)
        elif not isinstance(v, Constant):
            raise ValueError("the log-density of %s depends on %r, which is neither a free variable "
                             "of the model nor data" % (", ".join(repr(rv.name) for rv in observed), v))
    order = {v: i for i, v in enumerate(model.free_RVs)}
    params.sort(key=order.__getitem__)
    return params, data, row_vars, row_values


def _observed_logp(held, stand, name):
    """PyMC's per-row log-density of observed variable ``held`` (its free
    variables plain inputs) at ``stand``, a value of any number of rows."""
    try:
        return _pymc_logp(_sized_by(held, stand), stand)
    except NotImplementedError as exc:
        try:  # PyMC derives some only as the model built them (CustomDist(dist=...)):
            return _pymc_logp(held, stand)  # check_rowwise proves its rows split
        except NotImplementedError:
            raise ValueError("observed variable %r: PyMC gives no log-density for it made again with any "
                             "number of rows (%s); leave it out of observed=" % (name, exc)) from exc


def _pymc_logp(rv, value):
    """PyMC's log-density of ``rv`` at ``value``, derived as the model derives
    its own (``conditional_logp``, what ``model.logp()`` calls), so that each
    row is computed by the model's own formula.  ``pm.logp`` takes another
    route for some: a truncated Normal's normalizing constant then holds
    ``log(0.5)`` of a float32 constant, 1.9e-9 off on every row.  Where the
    model's route derives nothing, ``pm.logp``'s (NotImplementedError if
    neither does)."""
    import pymc as pm
    from pymc.logprob.basic import conditional_logp

    try:
        (logp,) = conditional_logp({rv: value}, warn_rvs=False).values()
    except (NotImplementedError, RuntimeError):  # (RuntimeError: no term derived)
        return pm.logp(rv, value, warn_rvs=False)
    return logp


def _check_no_draws(logp, rv):
    """Raise ValueError if ``logp`` (of observed ``rv``, with the free variables
    as plain inputs) depends on the value of a random variable: it would be a
    draw.  One whose shape alone is read (a mixture's components) draws nothing."""
    from pymc.distributions.distribution import SymbolicRandomVariable
    from pytensor.tensor.random.op import RandomVariable
    from pytensor.tensor.shape import Shape, Shape_i

    stack, seen = [logp], set()
    while stack:
        v = stack.pop()
        if v in seen or v.owner is None:
            continue
        seen.add(v)
        if isinstance(v.owner.op, RandomVariable | SymbolicRandomVariable):
            raise ValueError("%r: its log-density depends on random variable %r, which is not a free "
                             "variable of the model; leave it out of observed=" % (rv.name, v.name))
        if not isinstance(v.owner.op, Shape | Shape_i):
            stack.extend(v.owner.inputs)


def _is_generator(var):
    from pytensor.tensor.random.type import RandomType

    return isinstance(var.type, RandomType)


def _sized_by(rv, value):
    """``rv`` made again with its size taken from ``value``'s shape, when PyMC
    fixed it to the observed data's (a rank's share has fewer rows)."""
    from pymc.distributions.distribution import SymbolicRandomVariable
    from pymc.distributions.shape_utils import change_dist_size
    from pytensor.tensor.random.op import RandomVariable

    node = rv.owner
    if isinstance(node.op, SymbolicRandomVariable):  # Censored, Mixture, CustomDist(dist=...)
        return change_dist_size(rv, value.shape[:value.ndim - node.op.ndim_supp])
    if not isinstance(node.op, RandomVariable):
        return rv
    rng, size, *params = node.inputs
    if getattr(size.type, "ndim", None) != 1:  # no size: the shape follows the parameters
        return rv
    batch = value.ndim - node.op.ndim_supp
    new = node.op.make_node(rng, value.shape[:batch], *params)
    return new.outputs[node.outputs.index(rv)]


def _free_of_row_count(logp, rows):
    """``logp`` without the checks that its value has exactly ``rows`` rows
    (PyMC pins the observed value to the variable's shape): each rank has fewer."""
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import ancestors
    from pytensor.tensor.shape import SpecifyShape, specify_shape

    replace = {}
    for v in ancestors([logp]):
        node = v.owner
        if node is None or not isinstance(node.op, SpecifyShape):
            continue
        first = node.inputs[1]  # (a NoneConst, whose data is None, where the leading length is not pinned)
        if isinstance(first, Constant) and first.data is not None and first.data.ndim == 0 \
                and int(first.data) == rows:
            replace[v] = specify_shape(node.inputs[0], (None,) + tuple(node.inputs[2:]))
    return _replaced([logp], replace)[0] if replace else logp


# ----------------------------------------------- rows picked by a constant index
def _select_rows_in_data(logp, rows):
    """``logp`` with each constant selection of ``rows`` leading rows (a boolean
    mask or integer indices) moved down to the data it selects from."""
    from pytensor.graph.traversal import apply_ancestors

    replace = {}
    for node in apply_ancestors([logp]):
        picked = _picked_rows(node)
        if picked is None or len(picked) != rows:
            continue
        new = _taken(node.inputs[0], picked)
        if new is not None:
            replace[node.outputs[0]] = new
    return _replaced([logp], replace)[0] if replace else logp


def _picked_rows(node):
    """The leading rows ``node`` selects with one constant index, as integers;
    None if it is not such a selection."""
    from pytensor.graph.basic import Constant

    if not isinstance(node.op, array_indexing()[0]) or len(node.inputs) != 2 or \
            tuple(getattr(node.op, "idx_list", (0,))) != (0,):
        return None
    index = node.inputs[1]
    if not isinstance(index, Constant) or np.ndim(index.data) != 1:
        return None
    data = np.asarray(index.data)
    if data.dtype == bool:
        return np.flatnonzero(data)
    return data if data.dtype.kind in "iu" else None


def _taken(x, picked):
    """A graph equal to ``x[picked]`` that selects from data (constants and
    shared variables, whose selected rows become constants), or None."""
    import pytensor.tensor as pt
    from pytensor.tensor.elemwise import Elemwise

    value = _value_of(x)  # a constant, or pm.Data: its rows copied now, as split data are
    if value is not None:
        return pt.constant(value[picked]) if value.ndim else None
    node = x.owner
    if node is None:
        return None
    if isinstance(node.op, Elemwise):
        inputs = []
        for i in node.inputs:
            if i.type.ndim < x.type.ndim or i.type.broadcastable[0]:
                inputs.append(i)  # the same for every row
                continue
            taken = _taken(i, picked)
            if taken is None:
                return None
            inputs.append(taken)
        return node.op(*inputs)
    if _rows_from_first_input(node):  # (A @ w)[picked] = A[picked] @ w, and axes kept in place
        taken = _taken(node.inputs[0], picked)
        return None if taken is None else node.op(taken, *node.inputs[1:])
    inner = _picked_rows(node)
    if inner is not None:  # x = y[inner]: x[picked] = y[inner[picked]]
        return node.inputs[0][pt.constant(inner[picked])]
    return None


def _rows_from_first_input(node):
    """Whether ``node``'s output rows are its first input's rows, one for one: a
    matrix product of a matrix (``Dot``, or ``@``'s ``Blockwise`` of it), or a
    reshuffle of axes that keeps the leading one first (``@``'s squeeze)."""
    from pytensor.tensor.blockwise import Blockwise
    from pytensor.tensor.elemwise import DimShuffle
    from pytensor.tensor.math import Dot

    op, first = node.op, node.inputs[0]
    if isinstance(op, DimShuffle):
        return first.type.ndim >= 1 and len(op.new_order) >= 1 and op.new_order[0] == 0
    core = op.core_op if isinstance(op, Blockwise) else op
    return isinstance(core, Dot) and first.type.ndim == 2 and all(i.type.ndim <= 2 for i in node.inputs)
