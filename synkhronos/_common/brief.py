"""Values shown in error messages: ``repr`` cut short, so that a message
names a bad argument without printing a million rows."""

__all__ = ["brief"]

def brief(value, limit=80):
    """``repr(value)``, shortened to about ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 5] + " ...)"
