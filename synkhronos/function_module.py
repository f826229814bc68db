"""Compatibility name of the original API reference: ``synkhronos.function_module.Function``."""

from ._function import Function

__all__ = ["Function"]
