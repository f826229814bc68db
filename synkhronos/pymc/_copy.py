"""The copy of the model that ``data_parallel`` returns (the pipeline's last
stage): the model itself, its split terms computed by one Op of their
parameters and data (``_op``).

Each split observed variable stays an observed variable of the copy, whose
log-density is its term's of that Op (``_observed``); each split potential
stays a potential of the same name, whose value is its term's sum from the Op.
Everything else (free variables, their transforms and order, deterministics,
other potentials, coordinates) is the model's own, so PyMC's functions take
the copy as they take the model.
"""

from ._observed import split_observed

__all__ = ["check_copyable", "in_order_of", "with_op"]


def check_copyable(model):
    """Raise ValueError where PyMC cannot copy ``model`` as ``with_op`` does
    (checked before anything is split): a variable whose dims hold None, which
    PyMC's copy of a model refuses with a bare assertion."""
    for name, dims in model.named_vars_to_dims.items():
        if dims is not None and any(d is None for d in dims):
            raise ValueError("data_parallel copies the model as PyMC's clone_model does, which cannot copy "
                             "%r with dims=%r: name every dimension (with coords), or leave dims out"
                             % (name, tuple(dims)))


def with_op(model, terms, op):
    """A copy of ``model`` whose ``terms`` are computed by ``op`` of their
    parameters and data."""
    from pymc.model.fgraph import fgraph_from_model, model_from_fgraph
    from pytensor.graph.fg import FunctionGraph

    fgraph, memo = fgraph_from_model(model)
    inputs = [memo.get(v, v) for v in terms.params + terms.data]
    outputs = list(fgraph.outputs)
    sums = op.make_node(*inputs).outputs
    for term, var in enumerate(memo[rv] for rv in terms.observed):
        if len(var.owner.inputs) >= 2:  # an observed variable: (rv, value, ...)
            rv, value = var.owner.inputs[:2]
            wrapped = split_observed(op, term, rv, value, inputs)
            fgraph.change_node_input(var.owner, 0, wrapped, reason="synkhronos.pymc")
        else:  # a potential
            outputs[outputs.index(var)] = _potential(sums[term], var.name)
    new = FunctionGraph(outputs=outputs, clone=False)
    new._coords = fgraph._coords
    new._dim_lengths = fgraph._dim_lengths
    return _data_shared(model, in_order_of(model, model_from_fgraph(new, mutate_fgraph=True)))


def _data_shared(model, copy):
    """``copy`` with ``model``'s arrays for its ``pm.Data`` in place of the
    copies PyMC's clone made (as large as the data set): ``pm.set_data`` on
    either stores a new array in that one alone."""
    from pytensor.compile.sharedvalue import SharedVariable

    for name, var in copy.named_vars.items():
        theirs = model.named_vars.get(name)
        if isinstance(var, SharedVariable) and isinstance(theirs, SharedVariable) and var.type == theirs.type:
            var.set_value(theirs.get_value(borrow=True), borrow=True)
    return copy


def in_order_of(model, copy):
    """``copy`` (a copy of ``model``, as PyMC's clones are) with ``model``'s
    order of free and observed variables, so that compile_dlogp(),
    initial_point() and PyMC's groups of draws list them as ``model`` does,
    and of named variables, which PyMC's draws follow
    (pm.sample_prior_predictive gives the same numbers under one seed)."""
    for theirs, ours in ((model.free_RVs, copy.free_RVs), (model.observed_RVs, copy.observed_RVs)):
        order = {rv.name: i for i, rv in enumerate(theirs)}
        ours.sort(key=lambda rv: order[rv.name])
    names = {name: i for i, name in enumerate(model.named_vars)}
    named = sorted(copy.named_vars.items(), key=lambda kv: names.get(kv[0], len(names)))
    copy.named_vars.clear()
    copy.named_vars.update(named)
    return copy


def _potential(value, name):
    """PyMC's graph of a potential named ``name``: PyMC 6 takes the name as an
    argument, PyMC 5's ``model_potential`` is an Op and takes it from the output."""
    from pymc.model.fgraph import model_potential
    from pytensor.graph.op import Op

    if isinstance(model_potential, Op):
        potential = model_potential(value)
        potential.name = name
        return potential
    return model_potential(value, name)
