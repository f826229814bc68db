"""The ranks' graph in a form that can be sent to them (the pipeline's sixth
stage).

The graph travels to the ranks pickled, by pickle or else cloudpickle (the
lambdas of PyMC's measurable transforms go by cloudpickle).  A part that does
not pickle (an Op holding a lock, say) is found here, before any function is
registered: a batched graph then falls back to one point a call, whose graph
may pickle where the batched one does not; a graph that does not pickle either
way is refused, naming the terms, which the user can leave to this process.
"""

__all__ = ["sendable"]


def sendable(graph):
    """``graph`` (a ``RanksGraph``), or its graph of one point where only that
    pickles; raise ValueError where neither does."""
    from .._wire.pickling import dumps_cores

    one_point = graph.one_point()
    for form in [graph, one_point] if graph.batched else [one_point]:
        try:
            dumps_cores(form.outputs)
        except Exception as exc:  # an Op holding a lock, say (kept as failure: exc ends with the block)
            failure = exc
        else:
            return form
    raise ValueError(
        "observed %s: its log-density graph cannot be sent to the ranks (pickle and cloudpickle: "
        "%s: %s); leave it out of observed= to compute it in this process"
        % (graph.names, type(failure).__name__, failure)) from failure
