"""Compatibility name of the original API reference: ``synkhronos.data_module.Data``."""

from ._data import Data

__all__ = ["Data"]
