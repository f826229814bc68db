"""The MNIST demo trains to >= 95% test accuracy on the bundled digits (MLP in both
data patterns, CNN), on 2 CPU ranks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytensor
import pytest
from _flags import reference_env

DEMO = Path(__file__).resolve().parents[2] / "demos" / "mnist" / "train_mnist.py"


def _accuracy(stdout):
    summary = re.search(r"Summary: .* test accuracy ([0-9.]+)", stdout)
    assert summary, stdout[-2000:]
    return float(summary.group(1))


@pytest.mark.parametrize("model,pattern,epochs", [("mlp", "gpu_data", 30), ("cnn", "cpu_data", 15)])
def test_reaches_95_percent(model, pattern, epochs):
    # As a user runs it: the functions compile with JAX (the suite's flags leave the mode alone).
    proc = subprocess.run([sys.executable, str(DEMO), "--n", "2", "--pattern", pattern, "--model", model,
                           "--epochs", str(epochs)], env=reference_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _accuracy(proc.stdout) >= 0.95


def test_readme_command_quiet_says_compiling_plots_and_learns(tmp_path):
    """The README's command (MLP, cpu_data, 30 epochs) with the default settings:
    >= 95% test accuracy, no warning on stderr, the status line says that the
    functions compile with JAX (PyTensor 3; PyTensor 2: see below), and ``--plot``
    writes a PNG."""
    env = dict(os.environ, SYNKHRONOS_COMPILE_NOTICE_S="0")
    for name in ("PYTENSOR_FLAGS", "SYNKHRONOS_LOG_LEVEL"):
        env.pop(name, None)
    png = tmp_path / "curves.png"
    proc = subprocess.run([sys.executable, str(DEMO), "--n", "2", "--plot", str(png)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _accuracy(proc.stdout) >= 0.95
    assert png.read_bytes()[:4] == b"\x89PNG" and "Curves written to %s" % png in proc.stdout
    if pytensor.__version__.startswith("2."):
        # PyTensor 2's default is its C linker (it compiles in synk.function, no notice),
        # which warns itself where pip's numpy gives it no BLAS to link.
        ours = re.sub(r"\S*UserWarning: PyTensor could not link to a BLAS.*?warnings.warn\(\n", "",
                      proc.stderr, flags=re.S)
        assert "Warning" not in ours, ours
        return
    assert "Warning" not in proc.stderr, proc.stderr
    said = ("functions compile with JAX (floatX float32: float64 and int64 values are kept in 32 bits; "
            'mode="NUMBA" keeps them)')
    assert said in proc.stderr, proc.stderr
    assert "Synkhronos distributing functions..." in proc.stderr and "Synkhronos" not in proc.stdout


def test_plot_without_matplotlib_fails_early(tmp_path):
    blocker = tmp_path / "matplotlib.py"  # shadows the real package
    blocker.write_text("raise ImportError('no matplotlib here')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run([sys.executable, str(DEMO), "--plot", str(tmp_path / "c.png")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--plot needs matplotlib: pip install matplotlib" in proc.stderr, proc.stderr
    assert "Synkhronos" not in proc.stderr  # before forking


def test_help():
    proc = subprocess.run([sys.executable, str(DEMO), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--data-dir" in proc.stdout and "--pattern" in proc.stdout


def _write_idx(path, array, compress):
    import gzip
    import struct

    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    opener = gzip.open if compress else open
    with opener(str(path), "wb") as f:
        f.write(header + array.astype("uint8").tobytes())


@pytest.mark.parametrize("compress", [False, True])
def test_idx_files_are_read(tmp_path, compress):
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("train_mnist", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 28, 28))
    labels = rng.integers(0, 10, 12)
    suffix = ".gz" if compress else ""
    for name, arr in [("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                      ("t10k-images-idx3-ubyte", images[:5]), ("t10k-labels-idx1-ubyte", labels[:5])]:
        _write_idx(tmp_path / (name + suffix), arr, compress)
    x_tr, y_tr, x_va, y_va, x_te, y_te, name = demo.load_data(str(tmp_path), 0)
    assert name == "MNIST" and x_tr.shape == (12, 784) and x_te.shape == (5, 784)
    np.testing.assert_allclose(x_tr, images.reshape(12, 784) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y_tr, labels)
    np.testing.assert_array_equal(y_te, labels[:5])
