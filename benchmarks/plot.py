"""Redraw the PNG picture beside benchmark results JSON files (no GPU needed).

    python benchmarks/plot.py benchmarks/results/collectives.json [more.json ...]

Each ``X.json`` gets ``X.png`` beside it, drawn by the plotting function of the
benchmark that wrote it: the payload's ``"benchmark"`` key, or for files written
before the scripts recorded it, the file name (``collectives.json``, or a name
starting with one, like ``collectives_h200.json``); ``--kind`` overrides both.
Exit status 1 if any file could not be drawn (each failure is named on stderr).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _plots import PLOTTERS, write_plot  # noqa: E402


def plot_file(path, kind=None):
    """Draw the PNG beside ``path``; returns its path.  Raises ValueError or
    OSError with a message naming the file."""
    try:
        with open(path) as f:
            payload = json.load(f)
    except FileNotFoundError:
        raise OSError("%s: no such file" % path) from None
    except json.JSONDecodeError as exc:
        raise ValueError("%s: not valid JSON (%s)" % (path, exc)) from None
    if not isinstance(payload, dict):
        raise ValueError("%s: expected a JSON object (a benchmark's results), got %s"
                         % (path, type(payload).__name__))
    try:
        return write_plot(path, payload, kind=kind, required=True)
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError("%s: does not have the layout the %s plot expects (%s: %s)"
                         % (path, kind or payload.get("benchmark") or "benchmark's", type(exc).__name__,
                            exc)) from None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="benchmarks: " + ", ".join(sorted(PLOTTERS)))
    p.add_argument("json", nargs="+", help="results files written by the benchmark scripts")
    p.add_argument("--kind", choices=sorted(PLOTTERS), default=None,
                   help="the benchmark that wrote the files (default: from each file)")
    args = p.parse_args(argv)
    failed = 0
    for path in args.json:
        try:
            plot_file(path, args.kind)
        except ImportError as exc:
            p.exit(2, "plot.py: %s\n" % exc)
        except (OSError, ValueError) as exc:
            failed += 1
            print("plot.py: error: %s" % exc, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
