"""How the ranks talk: the commands and their records, the channels that
carry them, shared-memory segments and the buffers arrays travel in, and the
pickling of function cores."""

__all__ = []
