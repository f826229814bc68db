"""The copy of the model that ``data_parallel`` returns (the pipeline's last
stage): the model itself, its split variables replaced by one potential, the
Op of their parameters and data (``_op``).

Everything else (free variables, their transforms and order, deterministics,
other potentials, coordinates) is the model's own, so PyMC's functions take
the copy as they take the model.
"""

__all__ = ["with_op"]


def with_op(model, terms, op):
    """A copy of ``model`` with ``terms``' observed variables replaced by one
    potential, ``op`` of their parameters and data."""
    from pymc.model.fgraph import fgraph_from_model, model_from_fgraph, model_potential
    from pytensor.graph.fg import FunctionGraph

    fgraph, memo = fgraph_from_model(model)
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
    inputs = [memo.get(v, v) for v in terms.params + terms.data]
    potential = _potential(model_potential, op(*inputs)[0], "synkhronos_rows")
    outputs = [o for o in fgraph.outputs if o not in dropped] + [potential]
    new = FunctionGraph(outputs=outputs, clone=False)
    new._coords = fgraph._coords
    new._dim_lengths = fgraph._dim_lengths
    copy = model_from_fgraph(new, mutate_fgraph=True)
    # The original's order of free variables, so that compile_dlogp() and
    # initial_point() list them as the original does.
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    copy.free_RVs.sort(key=lambda rv: order[rv.name])
    return copy


def _potential(model_potential, value, name):
    """PyMC's graph of a potential named ``name``: PyMC 6 takes the name as an
    argument, PyMC 5's ``model_potential`` is an Op and takes it from the output."""
    from pytensor.graph.op import Op

    if isinstance(model_potential, Op):
        potential = model_potential(value)
        potential.name = name
        return potential
    return model_potential(value, name)
