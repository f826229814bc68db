"""JAX's 64-bit mode for a test (float64 ranks run in it), put back after."""

import contextlib

__all__ = ["jax_x64"]


@contextlib.contextmanager
def jax_x64():
    """JAX's 64-bit mode within; the mode before, after."""
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)
