"""Which linker a Synkhronos function compiles with on its device.

The device's own choice (JAX on GPU ranks, and on CPU ranks where JAX is the
default there: see ``_devices.cpu.jax_by_default``), the bf16 rewrite under
``fork(precision="bf16")``, the JAX rewrite that keeps shapes computed from
shapes concrete, the JAX linker that keeps checks (``_graph.jax_checks``), and
the way back: where JAX is only the default, a graph it
cannot compile (an Op with no JAX implementation) compiles with PyTensor's own
default linker, with a log line naming the function and the Op.
"""

import logging

from .expand_dims import expand_dims_sunk_mode
from .function_core import compile_function, is_jax_mode, links_with_jax
from .max_gradient import max_gradient_mode

__all__ = ["compile_for_device", "device_kwargs"]

logger = logging.getLogger("synkhronos")


def device_kwargs(device, kwargs):
    """``pytensor.function``'s keyword arguments for ``device``: its mode with
    the rewrite that takes a maximum's gradient from its operands (``_graph.max_gradient``)
    and the one that keeps elementwise work at its operands' axes (``_graph.expand_dims``),
    the bf16 rewrite under ``fork(precision="bf16")`` (see ``_graph.bf16``), and in JAX
    mode the rewrites that keep shapes computed from shapes concrete and
    reductions in their declared dtype (``_graph.jax_reductions``), linked by
    the JAX linker that keeps the graph's checks (``_graph.jax_checks``)."""
    kwargs = device.function_kwargs(kwargs)
    kwargs["mode"] = expand_dims_sunk_mode(max_gradient_mode(kwargs.get("mode")))
    if device.precision == "bf16":
        from .bf16 import bf16_mode

        kwargs["mode"] = bf16_mode(kwargs.get("mode"))
    if is_jax_mode(kwargs.get("mode")):
        from .jax_checks import checked_mode
        from .jax_reductions import reduction_dtypes_mode
        from .jax_shapes import jax_mode

        kwargs["mode"] = checked_mode(reduction_dtypes_mode(jax_mode(kwargs["mode"])))
    return kwargs


def linker_reason(device, given):
    """Why a function compiled with the user's ``given`` keyword arguments gets
    the linker it gets on ``device``, as the debug log line says it."""
    if "mode" in given:
        return "the mode the function names"
    if device.jax_default:
        return "CPU ranks' default (JAX: fastest on every kind of graph measured)"
    if device.name == "gpu":
        return "GPU ranks run JAX"
    return "PyTensor's mode from its flags"


def compile_for_device(device, inputs, outputs, updates, givens, kwargs, label):
    """Compile the plain PyTensor function of a Synkhronos function for
    ``device``; returns it, the keyword arguments it was compiled with, and why
    it has its linker (for the log).  ``kwargs`` are the user's; ``label``
    names the function in the log line."""
    given = kwargs
    kwargs = device_kwargs(device, given)
    if links_with_jax(kwargs.get("mode")):  # before PyTensor's JAX linker starts the backend
        device.start_jax_pool()
    by_default = "mode" not in given and device.jax_default
    try:
        plain = compile_function(inputs, list(outputs), updates=updates, givens=givens, **kwargs)
        return plain, kwargs, linker_reason(device, given)
    except NotImplementedError as exc:
        if not by_default:
            raise
        reason = "JAX cannot compile it (%s)" % str(exc).splitlines()[0]
        logger.info("function %s: %s; it compiles with PyTensor's default linker instead",
                    repr(given["name"]) if given.get("name") else label, reason)
    kwargs = device_kwargs(device, dict(given, mode="Mode"))
    return compile_function(inputs, list(outputs), updates=updates, givens=givens, **kwargs), kwargs, reason
