"""PyMC models, data-parallel: ``data_parallel(model)`` returns a copy of a
PyMC model whose likelihood over rows of data runs on every Synkhronos rank;
``loo(idata, copy)`` is its PSIS leave-one-out cross-validation, each rank
computing it for its own rows.

Needs PyMC (``pip install "synkhronos[pymc]"``).  See the docs page "PyMC".
"""

try:
    import pymc as _pymc  # noqa: F401
except ImportError as e:  # the message names the extra to install
    raise ImportError("synkhronos.pymc needs PyMC: pip install \"synkhronos[pymc]\"") from e

from ._loo import loo
from ._model import data_parallel

__all__ = ["data_parallel", "loo"]
