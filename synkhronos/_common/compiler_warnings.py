"""Warnings that PyTensor's backends raise about code PyTensor generates, which a
user cannot act on, hidden while functions compile."""

import contextlib
import warnings

__all__ = ["JAX_DTYPE_WARNING", "compiler_warnings_hidden"]

# JAX, when PyTensor's JAX backend asks it for an int64 or float64 value (index
# arithmetic, float64 accumulators of float32 sums) in 32-bit mode.
JAX_DTYPE_WARNING = "Explicitly requested dtype (int64|float64|uint64) requested in .* is not available"


@contextlib.contextmanager
def compiler_warnings_hidden(linker=None):
    """Hide the warnings that PyTensor's backends raise while they compile a
    function, about code PyTensor generates, which a user cannot act on: the
    JAX backend's copies of random generators (see ``compile_function``),
    JAX's 32-bit dtypes (``JAX_DTYPE_WARNING``) and Numba's object mode for the
    bf16 emulation (``synkhronos._graph.bf16``).

    For compiling only: ``warnings.catch_warnings`` swaps the process's filters
    while the block runs, which costs microseconds and is not thread-safe, so
    calls go through it only when JAX traces them (see ``FunctionCore.variant``).

    Parameters
    ----------
    linker : pytensor Linker, optional
        The linker that compiles the function.
    """
    if type(linker).__name__ == "NumbaLinker":
        # PyTensor hides Numba's false warnings about its generated code ("np.dot() is
        # faster on contiguous arrays" for its transposes, numba/numba#10086) with a
        # process-wide filter that it installs when its Numba backend is first imported.
        # Imported inside catch_warnings, that filter would end with the block.
        import pytensor.link.numba.dispatch  # noqa: F401
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The RandomType SharedVariables", category=UserWarning)
        warnings.filterwarnings("ignore", message=JAX_DTYPE_WARNING, category=UserWarning)
        # fork(precision="bf16") on CPU workers: the emulation is a Python perform by design
        # (see _graph.bf16), which Numba runs in object mode and says so for each node.
        warnings.filterwarnings("ignore", message="Numba will use object mode to run Bf16",
                                category=UserWarning)
        yield
