"""Kept for ``python setup.py``-style installs; the metadata is in pyproject.toml."""

from setuptools import setup

setup()
