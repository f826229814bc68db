"""Parts every layer uses and that know nothing of a session: row selections,
reductions, which values fit a dtype, checked environment settings, logging,
the one wait helper, short reprs for messages, hidden compiler warnings."""

__all__ = []
