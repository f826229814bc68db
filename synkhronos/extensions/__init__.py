"""Extensions for deep learning with Synkhronos: update rules whose gradients travel
in one flat shared vector (``updates``) and one-call training steps (``train``)."""

from . import train, updates

__all__ = ["updates", "train"]
