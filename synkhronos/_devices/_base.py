"""What a device layer provides: the interface every rank's device implements
(``cpu``, ``cpu_mpi``, ``gpu``).  The runtime, functions and collectives talk to
a device only through these members."""

from .._common.env import SPIN_DEFAULT
from .._common.selections import take_rows

__all__ = ["Device"]


class Device:
    """How one rank runs functions and holds shared values.

    Class attributes
    ----------------
    name : {"cpu", "gpu"}
        The device kind (also what workers are told to build).
    label : str
        What status lines call a set of them ("CPU cores", "GPUs").
    has_collectives : bool
        Collectives on shared variables run on the device (``all_reduce``,
        ``reduce``, ``broadcast``, ``gather``, ``all_gather`` below: NCCL on
        GPUs, MPI for CPU ranks of an MPI launch); the public ``nccl=True``
        asks for them.  Otherwise they go through shared memory.
    queued : bool
        Device work is queued: a call or collective may return before the
        device has done it (``synchronize`` waits).
    reduces_outputs : bool
        Function outputs of static shape are reduced into the master on the
        device (``reduce_outputs``/``take_outputs``) in ``reduce_dtypes``.
    reduce_dtypes : tuple of str
    spin_s : float
        Seconds a process polls for the next message before it sleeps
        (``_wire.channel``), unless ``$SYNKHRONOS_SPIN_US`` says otherwise.

    Attributes
    ----------
    precision : {"highest", "tf32", "bf16"}
        How float32 products are computed (see ``fork``).
    wait_hook : callable or None
        In the master, called while it waits on its device, so that a worker's
        failure is raised instead of waited on.
    """

    name = None
    label = None
    has_collectives = False
    queued = False
    reduces_outputs = False
    reduce_dtypes = ()
    spin_s = SPIN_DEFAULT
    wait_hook = None
    jax_default = False  # functions that name no mode compile with JAX only where it is the default

    def __init__(self, precision="highest"):
        self.precision = precision

    # ------------------------------------------------------------- start-up
    @property
    def status(self):
        """What the status line of ``fork()`` says about the numerics ("" for nothing)."""
        return ""

    def available(self):
        """How many ranks this device kind can run on this host."""
        raise NotImplementedError

    def configure_jax(self):
        """Bring JAX's settings in line with PyTensor's (before functions compile)."""

    def start_jax_pool(self):
        """Start JAX's backend for this rank, when the session has JAX functions."""

    def worker_env(self, rank, n_parallel):
        """Environment variables for the process of worker ``rank``."""
        return {}

    def setup_master(self, rank):
        """Prepare the master's own process to be rank ``rank``."""

    def function_kwargs(self, kwargs):
        """The ``pytensor.function`` keyword arguments for this device."""
        return kwargs

    def after_updates(self, core):
        """After a call of ``core`` updated its shared variables on this rank."""

    def input_rows(self, k, array, sel):
        """Rows ``sel`` of ``array``, this rank's share of scattered input
        ``k`` of a call: a view for a slice, a gathered copy for indices."""
        return take_rows(array, sel)

    def pin_host(self, segment):
        """Page-lock a shared-memory ``segment`` this rank reads inputs from,
        where the device copies from there faster (GPU ranks); returns the
        function that undoes it, or None (here: nothing done)."""
        return None

    def place_shareds(self, shareds):
        """Put the distributed shared variables' values where calls use them."""

    def close(self, abort=False):
        """Release the device's resources; ``abort``: a collective may be stuck."""

    def synchronize(self, shareds):
        """Wait until this rank's queued device work is done."""

    # ---------------------------------------------------------------- values
    def to_host(self, values):
        """A rank's function outputs (or shared values) as numpy arrays."""
        raise NotImplementedError

    def get_value(self, var):
        """The value of shared variable ``var`` on this rank, as numpy."""
        raise NotImplementedError

    def shape(self, var):
        """The shape of ``var``'s value on this rank, without a copy."""
        raise NotImplementedError

    def set_value(self, var, value):
        """Make a private copy of ``value`` ``var``'s value on this rank."""
        raise NotImplementedError

    # ------------------------------------------ collectives (has_collectives)
    def new_uid(self):
        """The master's rendezvous token for ``init_comm``."""
        return None

    def init_comm(self, n_parallel, rank, uid):
        """Join the communicator of all ranks (every rank, at start-up)."""
        raise NotImplementedError

    def numpy_interface(self, shareds, on_set, before_get):
        """In the master: make ``var.get_value()`` give numpy; ``on_set(var)``
        after a value is set, ``before_get()`` before one is read."""

    def check_collective(self, variables, op=None):
        """Raise TypeError, before any rank starts, for what the device cannot
        move (or reduce under ``op``)."""

    def all_reduce(self, variables, op, shapes):
        """Every rank's variables become their reduction under ``op``."""
        raise NotImplementedError

    def reduce(self, variables, op, root, in_place, shapes):
        """Reduce into ``root``: the results there (or set, ``in_place``); [] elsewhere."""
        raise NotImplementedError

    def broadcast(self, variables, root, shapes):
        """Every rank takes ``root``'s values."""
        raise NotImplementedError

    def gather(self, variables, root, shapes):
        """``root`` gets every rank's values, per variable in rank order."""
        raise NotImplementedError

    def all_gather(self, variables, shapes):
        """Every rank's value becomes the ranks' values joined along axis 0."""
        raise NotImplementedError

    # -------------------------------------------- outputs (reduces_outputs)
    def reduce_outputs(self, outputs, specs, weight, root):
        """Queue the reduction of a call's outputs into ``root``."""
        raise NotImplementedError

    def take_outputs(self, results):
        """The outputs ``reduce_outputs`` left on ``root``, on the host."""
        raise NotImplementedError
