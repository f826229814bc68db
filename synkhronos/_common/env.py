"""Settings read from environment variables, checked: each parser names the
variable and the bad value in its error."""

import os

__all__ = ["env_nonnegative", "env_flag", "spin_seconds", "SPIN_ENV", "SPIN_DEFAULT"]

# How long a process polls for the next message before it sleeps (see
# ``_wire.channel``): long enough for a small call's reply; longer polls did not
# make tiny calls faster (see the docs page "Benchmarks", *Design decisions*).
SPIN_ENV = "SYNKHRONOS_SPIN_US"
SPIN_DEFAULT = 100e-6


def env_nonnegative(name, default, unit):
    """The non-negative, finite number in environment variable ``name``, or
    ``default`` when it is unset or blank; ``unit`` names the unit in the error.

    Raises
    ------
    ValueError
        If the variable is not a non-negative, finite number (the message names
        the variable and the value).
    """
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError("%s must be a non-negative number of %s, got %r" % (name, unit, text))
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name, default):
    """The boolean in environment variable ``name`` (1/0, true/false, yes/no,
    on/off, any case), or ``default`` when it is unset or blank.

    Raises
    ------
    ValueError
        For any other value (the message names the variable and the value).
    """
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError("%s must be 1 or 0 (or true/false, yes/no, on/off), got %r" % (name, text))
    return word in _TRUE


def spin_seconds(default=SPIN_DEFAULT):
    """Seconds to poll before blocking: ``$SYNKHRONOS_SPIN_US`` (microseconds)
    if set, else ``default`` (the device's: see ``Device.spin_s``).  Read at
    ``fork()``; workers get the master's.

    Raises
    ------
    ValueError
        If the variable is not a non-negative number.
    """
    micros = env_nonnegative(SPIN_ENV, None, "microseconds")
    return default if micros is None else micros * 1e-6
