"""How the suite compiles: Synkhronos functions as a user's compile, the tests'
own PyTensor functions (their references) as FAST_COMPILE compiles them.

``REFERENCE_FLAGS`` sets PyTensor's default linker and rewrites, not its
``mode``: the mode stays PyTensor's default, so CPU ranks compile every
Synkhronos function that names no mode with JAX, as they do for a user
(``_devices.cpu.jax_by_default``), while a plain ``pytensor.function`` in a test
runs each node's own ``perform`` after the fast_compile rewrites: the graph as
written, in a fraction of a second on a cold machine.  A test about another
linker names its mode.  See the docs page "Contributing", *Tests*.
"""

import os

__all__ = ["REFERENCE_FLAGS", "reference_env"]

REFERENCE_FLAGS = "linker=py,optimizer=fast_compile"


def reference_env(env=None):
    """``env`` (default: this process's environment, copied) with the suite's
    ``PYTENSOR_FLAGS`` where it names none: for scripts the tests run."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTENSOR_FLAGS", REFERENCE_FLAGS)
    return env
