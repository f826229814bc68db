"""What a session knows about: its functions, the shared variables they use,
its live Data objects, and the shapes each rank's shared values had when the
master last asked.  Other modules read and change it only through its methods."""

import weakref

__all__ = ["Registry"]


class Registry:
    """The functions, shared variables and Data of one session."""

    def __init__(self):
        self._functions = []
        self._shareds = []
        self._shared_ids = {}  # id(var) -> index in _shareds (which keeps each var alive)
        self._datas = weakref.WeakValueDictionary()  # ID -> live Data
        self._next_data_id = 0
        # Per-rank shapes of shared variables, by index, as far as the master knows
        # them (device collectives need every rank's sizes before they start).
        self._shapes = {}
        # How many functions and shared variables the workers hold: the first ones
        # registered (distribute() sends only those added since).
        self.n_distributed_functions = 0
        self.n_distributed_shareds = 0
        self._refused = {}  # function index -> why distribute() could not send it

    # ------------------------------------------------------------ functions
    def add_function(self, fn, shareds):
        """Register function ``fn`` and the shared variables it uses; returns
        its index (what workers know it by)."""
        self._functions.append(fn)
        self.add_shareds(shareds)
        return len(self._functions) - 1

    def next_function_index(self):
        """The index the next function will get."""
        return len(self._functions)

    def function(self, index):
        return self._functions[index]

    @property
    def functions(self):
        """The registered functions, in order (a copy)."""
        return list(self._functions)

    def is_distributed(self, index):
        """Whether the workers hold function ``index`` (or refused it)."""
        return index < self.n_distributed_functions

    def refusal(self, index):
        """The error a call of function ``index`` raises because it could not be
        sent to the workers, or None."""
        return self._refused.get(index)

    def undistributed(self):
        """(functions, shared variables) registered since the last distribution."""
        return (self._functions[self.n_distributed_functions:],
                self._shareds[self.n_distributed_shareds:])

    def mark_distributed(self, refused=None):
        """The workers now hold every registered function and shared variable,
        but those of ``refused``: function index -> the error their calls raise
        (they could not be sent; the workers hold nothing in their place)."""
        self._refused.update(refused or {})
        self.n_distributed_functions = len(self._functions)
        self.n_distributed_shareds = len(self._shareds)

    # -------------------------------------------------------------- shareds
    def add_shareds(self, variables):
        for v in variables:
            if self.shared_id(v) is None:
                self._shared_ids[id(v)] = len(self._shareds)
                self._shareds.append(v)

    def shared_id(self, var):
        """Index of ``var`` among the shared variables, or None.  A dict, not a
        scan: every collective looks its variables up."""
        return self._shared_ids.get(id(var))

    def shared(self, index):
        return self._shareds[index]

    @property
    def shareds(self):
        """The shared variables, by index (a copy)."""
        return list(self._shareds)

    # ---------------------------------------------------------------- shapes
    def record_shapes(self, index, per_rank):
        """Shared variable ``index`` has shape ``per_rank[r]`` on rank ``r``."""
        self._shapes[index] = list(per_rank)

    def shapes(self, index):
        """The recorded per-rank shapes of shared variable ``index``, or None."""
        return self._shapes.get(index)

    def forget_shapes(self, indices):
        """The values of shared variables ``indices`` may have changed shape."""
        for i in indices:
            self._shapes.pop(i, None)

    def forget_shape(self, var):
        """``var``'s value was replaced in the master: its recorded shapes may be stale."""
        i = self.shared_id(var)
        if i is not None:
            self._shapes.pop(i, None)

    # ----------------------------------------------------------------- datas
    def add_data(self, make):
        """Register the Data object ``make(ID)`` returns, under a new ID."""
        ID = self._next_data_id
        self._next_data_id += 1
        d = self._datas[ID] = make(ID)
        return d

    @property
    def datas(self):
        """The live Data objects (a list)."""
        return list(self._datas.values())

    def clear_datas(self):
        self._datas.clear()
