"""Compiling a Synkhronos function on a rank: its arguments checked, its
variants compiled and cached, the linker each device uses, the graph rewrites
for JAX and bf16, Numba compiled once per host."""

__all__ = []
