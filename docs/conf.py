"""Sphinx configuration of the Synkhronos documentation.

Build with ``python -m sphinx -W -b html docs docs/_build`` after
``pip install ".[docs]"``.  Pages are Markdown (MyST); the API reference is
generated from the numpydoc docstrings (napoleon).
"""

import logging
import os
import sys

# accessible-pygments (a dependency of furo) calls logging.basicConfig(level=INFO) when
# Pygments loads it, which would print PyTensor's INFO records during the build; a root
# handler that drops everything makes that call a no-op.
logging.getLogger().addHandler(logging.NullHandler())

# Autodoc imports the package from this checkout, also when it is not installed.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
import synkhronos  # noqa: E402

project = "Synkhronos"
author = "Synkhronos developers"
copyright = "2017 Adam Stooke; 2026 Synkhronos developers"
release = synkhronos.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "examples/README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = "Synkhronos %s" % release
html_static_path = ["_static"]
