"""One call's journey: the master plans it (the rows each rank takes), every
rank runs its share, the master reduces the results."""

__all__ = []
