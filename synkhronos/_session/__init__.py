"""The session and its processes: the one object that holds the runtime
state, the workers launched (on this host or by MPI) and their command loop,
the command engine and the failures it turns into exceptions, and the services for
the session's child processes."""

__all__ = []
