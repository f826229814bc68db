"""A PyMC model's row terms (the pipeline's second stage): for each variable
split, its log-density as a sum over rows of data, and the inputs that
log-density reads, each by its role.

A term is split when its observed value has the model's row count ``rows`` in
its leading dimension.  Its log-density (``pm.logp``, one value per row) is then
rebuilt with placeholders:

- each free random variable it depends on becomes a broadcast input (the
  parameters, sent on every evaluation);
- each observed value, ``pm.Data`` or constant with ``rows`` rows becomes a
  shared variable that holds one rank's rows (split once);
- other ``pm.Data`` become broadcast inputs too, so ``pm.set_data`` on them
  reaches the ranks.

Whether the rows can in fact be split is proved next (``_split``).
"""

import numpy as np

from ._graphs import leading as _leading
from ._graphs import replaced as _replaced
from ._graphs import row_input as _row_input
from ._graphs import value_of as _value_of
from ._potentials import per_row
from ._select import select_rows_in_data

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


def find_terms(model, observed, rows):
    """The ``RowTerms`` of ``model``'s observed variables ``observed`` over
    ``rows`` rows."""
    # The free variables as plain inputs while PyMC derives each log-density:
    # its rewrites of measurable variables (Censored, say) clone the random
    # variables they meet, which would then no longer be the model's.
    holders = {rv: rv.type(name=rv.name) for rv in model.free_RVs}
    logps, stands, stand_values = _row_logps(model, observed, rows, holders)
    params, data, row_vars, row_values = _inputs_by_role(model, observed, rows, holders, logps, stands)
    return RowTerms(list(observed), params, [holders[p] for p in params], data,
                    stands + row_vars, stand_values + row_values, logps)


def _row_logps(model, observed, rows, holders):
    """Each of ``observed``'s per-row log-densities, its free variables replaced
    by ``holders``, and the inputs that stand for the observed values, with
    those values: ``(logps, stands, stand_values)``."""
    logps, stands, stand_values = [], [], []
    for rv in observed:
        if rv in model.potentials:
            (lp,) = _replaced([per_row(rv)], holders)
        else:
            stand, stand_value = _stand_in(model.rvs_to_values[rv], rv.name, rows)
            stands.append(stand)
            stand_values.append(stand_value)
            lp = _observed_logp(_replaced([rv], holders)[0], stand, rv.name)
        _check_no_draws(lp, rv)
        logps.append(_free_of_row_count(select_rows_in_data(lp, rows), rows))
    return logps, stands, stand_values


def _stand_in(value, name, rows):
    """An input of any number of rows that stands for observed value ``value``
    (of variable ``name``), and the value itself, contiguous."""
    if _leading(value) != rows:
        raise ValueError("observed variable %r has %s rows, not %d like the others: it cannot be "
                         "split with them (leave it out of observed=)"
                         % (name, _leading(value), rows))
    stand = _row_input(value, name)
    return stand, np.ascontiguousarray(_value_of(value))


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
    import pymc as pm

    try:
        return pm.logp(_sized_by(held, stand), stand, warn_rvs=False)
    except NotImplementedError as exc:
        try:  # PyMC derives some only as the model built them (CustomDist(dist=...)):
            return pm.logp(held, stand, warn_rvs=False)  # check_rowwise proves its rows split
        except NotImplementedError:
            raise ValueError("observed variable %r: PyMC gives no log-density for it made again with any "
                             "number of rows (%s); leave it out of observed=" % (name, exc)) from exc


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
        first = node.inputs[1]
        if isinstance(first, Constant) and first.data.ndim == 0 and int(first.data) == rows:
            replace[v] = specify_shape(node.inputs[0], (None,) + tuple(node.inputs[2:]))
    return _replaced([logp], replace)[0] if replace else logp
