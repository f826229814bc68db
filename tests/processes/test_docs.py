"""The documentation: the site builds with warnings as errors, every code example on it
runs on CPU workers and checks its own results, and no Python code reaches a page
or the README without running here."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _flags import reference_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
PAGES = sorted(DOCS.glob("*.md"))
TIMEOUT = 300  # seconds; an example takes a few (JAX compiles each function on every rank)
INCLUDE = re.compile(r"```\{literalinclude\}\s+(\S+)")
FENCE = re.compile(r"^```(\w+)\s*$", re.MULTILINE)


def _env():
    """The suite's flags: Synkhronos's functions compile as a user's (JAX on CPU
    ranks), an example's plain PyTensor functions as FAST_COMPILE does."""
    env = reference_env()
    env.pop("SYNKHRONOS_LOG_LEVEL", None)
    return env


def _run_script(path, cwd):
    return subprocess.run([sys.executable, str(path)], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT)


README_EXAMPLE_ID = "readme"


def run_example(example, tmp_path):
    """Run a docs example file, or the README's example for ``README_EXAMPLE_ID``."""
    if example == README_EXAMPLE_ID:
        blocks = _readme_python_blocks()
        assert len(blocks) == 1, "the README shows one Python example"
        example = tmp_path / "readme_example.py"
        example.write_text(blocks[0] + '\nprint("All assertions passed.")\n')
    return _run_script(example, cwd=example.parent)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_checks_itself(example, tmp_path):
    if "import pymc" in example.read_text() and importlib.util.find_spec("pymc") is None:
        pytest.skip("needs PyMC (pip install \".[pymc]\"); the PyMC CI step runs it")
    proc = run_example(example, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "All assertions passed." in proc.stdout, out
    assert "Warning" not in proc.stderr, proc.stderr


def test_every_example_is_on_a_page_and_every_include_exists():
    included = set()
    for page in PAGES:
        for target in INCLUDE.findall(page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), "%s includes %s, which does not exist" % (page.name, target)
            included.add(path)
    assert EXAMPLES, "no examples found"
    missing = [p.name for p in EXAMPLES if p.resolve() not in included]
    assert not missing, "examples shown on no page: %s" % missing


def test_pages_show_python_only_from_tested_examples():
    """Python on a page comes from docs/examples (run above), never from an inline block."""
    for page in PAGES:
        languages = FENCE.findall(page.read_text())
        assert "python" not in languages, "%s: move inline python to docs/examples" % page.name


def _readme_python_blocks():
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)


def test_readme_example_runs(tmp_path):
    proc = run_example(README_EXAMPLE_ID, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All assertions passed." in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr


def test_readme_links_every_page():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in PAGES if "docs/%s" % p.name not in readme]
    assert not unlinked, "README links no %s" % unlinked


def test_sphinx_builds_without_warnings(tmp_path):
    """What CI's docs build runs: ``python -m sphinx -W -b html docs docs/_build``."""
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(DOCS), str(tmp_path / "html")], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in PAGES:
        assert (tmp_path / "html" / (page.stem + ".html")).is_file(), page.name
    for png in (DOCS / "_static" / "benchmarks").glob("*.png"):
        assert (tmp_path / "html" / "_static" / "benchmarks" / png.name).is_file(), png.name


BENCH_JSON = sorted((DOCS / "_static" / "benchmarks").glob("*.json"))


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory):
    """Every picture redrawn by one ``benchmarks/plot.py`` run from copies of the
    JSON files (one process, not one per picture): (folder, the run)."""
    folder = tmp_path_factory.mktemp("redrawn")
    for results in BENCH_JSON:
        (folder / results.name).write_text(results.read_text())
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plot.py"),
                           *[str(folder / r.name) for r in BENCH_JSON]],
                          capture_output=True, text=True, timeout=TIMEOUT)
    return folder, proc


@pytest.mark.parametrize("results", BENCH_JSON, ids=[p.stem for p in BENCH_JSON])
def test_benchmark_pictures_redraw_from_their_json(results, redrawn):
    """Each picture on the benchmarks page is drawn by ``benchmarks/plot.py`` from the
    JSON beside it (so the page shows what the scripts draw), and is on the page."""
    folder, proc = redrawn
    drawn_png = folder / (results.stem + ".png")
    # plot.py names every file it could not draw on stderr, and draws the others
    assert drawn_png.is_file() and str(folder / results.name) not in proc.stderr, proc.stdout + proc.stderr
    from matplotlib.image import imread

    drawn, shown = imread(drawn_png), imread(results.with_suffix(".png"))
    assert drawn.shape == shown.shape
    assert "_static/benchmarks/%s.png" % results.stem in (DOCS / "benchmarks.md").read_text()
