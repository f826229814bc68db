#!/usr/bin/env bash
# The suite with the PyMC extra on another Python (what pip installs there: PyMC 6 and
# PyTensor 3.3 on Python 3.12+), in an environment of its own, .venv-py<version>.
# The interpreter is found as a user's machine offers it: python<version> on PATH, or a
# pyenv version directory. Without one the leg is skipped, and says so.
# Usage: tools/test-on-python.sh 3.12
set -euo pipefail
version="${1:?usage: tools/test-on-python.sh VERSION (for example 3.12)}"
cd "$(dirname "$0")/.."

works() { "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" 2>/dev/null; }

python=""
for candidate in "python$version" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/python"$version"; do
    if works "$candidate"; then python="$candidate"; fi
done
if [ -z "$python" ]; then
    echo "Python $version leg skipped: no python$version on PATH or in pyenv's versions" \
         "(${PYENV_ROOT:-$HOME/.pyenv}/versions)"
    exit 0
fi
echo "Python $version leg: $python"
"$python" -m venv ".venv-py$version"
".venv-py$version/bin/pip" install ".[pymc,test]"
".venv-py$version/bin/python" -m pytest -q
