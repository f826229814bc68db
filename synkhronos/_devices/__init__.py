"""Device layers: how a rank runs functions and holds shared values.

``cpu`` runs PyTensor's default CPU linker in one process per worker; a GPU layer
provides the same interface (``name``, ``worker_env``, ``get_value``,
``set_value``) for one process per GPU.
"""

__all__ = []
