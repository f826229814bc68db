"""A user's exception type for the graph-check tests: ranks unpickle the
``CheckAndRaise`` that raises it, so it lives in a module they can import."""

__all__ = ["RowsError"]


class RowsError(ValueError):
    """Rows outside the range a user's ``CheckAndRaise`` allows."""
