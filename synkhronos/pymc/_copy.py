"""The copy of the model that ``data_parallel`` returns (the pipeline's last
stage): the model itself, its split terms computed by one Op of their
parameters and data (``_op``).

One split observed variable stays an observed variable of the copy, whose
log-density is that Op's (``_observed``); several split terms, or a split
potential, become one potential of the Op.  Everything else (free variables,
their transforms and order, deterministics, other potentials, coordinates) is
the model's own, so PyMC's functions take the copy as they take the model.
"""

from ._observed import split_observed

__all__ = ["POTENTIAL", "with_op"]

POTENTIAL = "synkhronos_rows"  # the potential's name, where the split terms are one


def with_op(model, terms, op):
    """A copy of ``model`` whose ``terms`` are computed by ``op`` of their
    parameters and data."""
    from pymc.model.fgraph import fgraph_from_model, model_from_fgraph
    from pytensor.graph.fg import FunctionGraph

    fgraph, memo = fgraph_from_model(model)
    inputs = [memo.get(v, v) for v in terms.params + terms.data]
    kept = memo[terms.observed[0]] if _one_observed(terms, memo) else None
    if kept is not None:
        rv, value = kept.owner.inputs[:2]
        wrapped = split_observed(op, rv, value, inputs)
        fgraph.change_node_input(kept.owner, 0, wrapped, reason="synkhronos.pymc")
        outputs = list(fgraph.outputs)
    else:
        outputs = _as_potential(fgraph, memo, terms, op, inputs)
    new = FunctionGraph(outputs=outputs, clone=False)
    new._coords = fgraph._coords
    new._dim_lengths = fgraph._dim_lengths
    copy = model_from_fgraph(new, mutate_fgraph=True)
    # The original's order of free variables, so that compile_dlogp() and
    # initial_point() list them as the original does.
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    copy.free_RVs.sort(key=lambda rv: order[rv.name])
    # And the original's order of named variables, which PyMC's draws follow
    # (pm.sample_prior_predictive gives the same numbers under one seed).
    names = {name: i for i, name in enumerate(model.named_vars)}
    named = sorted(copy.named_vars.items(), key=lambda kv: names.get(kv[0], len(names)))
    copy.named_vars.clear()
    copy.named_vars.update(named)
    return copy


def _one_observed(terms, memo):
    """Whether the split terms are one observed variable (no potential)."""
    return len(terms.observed) == 1 and len(memo[terms.observed[0]].owner.inputs) >= 2


def _as_potential(fgraph, memo, terms, op, inputs):
    """The outputs of ``fgraph`` with ``terms``' variables replaced by one
    potential of ``op``."""
    from pymc.model.fgraph import model_potential

    dropped = {memo[rv] for rv in terms.observed}
    for var in dropped:
        if len(var.owner.inputs) < 2:  # a potential: nothing reads it
            continue
        # Other variables (the whole of a variable with imputed values, say)
        # read its observed value, as they do in PyMC's own log-density.
        value = var.owner.inputs[1]
        for node, i in list(fgraph.clients[var]):
            if node != "output" and getattr(node, "op", None).__class__.__name__ != "Output":
                fgraph.change_node_input(node, i, value, reason="synkhronos.pymc")
    potential = _potential(model_potential, op(*inputs)[0], POTENTIAL)
    return [o for o in fgraph.outputs if o not in dropped] + [potential]


def _potential(model_potential, value, name):
    """PyMC's graph of a potential named ``name``: PyMC 6 takes the name as an
    argument, PyMC 5's ``model_potential`` is an Op and takes it from the output."""
    from pytensor.graph.op import Op

    if isinstance(model_potential, Op):
        potential = model_potential(value)
        potential.name = name
        return potential
    return model_potential(value, name)
