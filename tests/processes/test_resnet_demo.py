"""The ResNet demo, in a tiny configuration on 2 CPU ranks: it trains (the loss of
the repeated synthetic batch falls) and reports images/s and the speedup."""

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "demos" / "resnet" / "train_resnet.py"


def test_tiny_resnet_on_cpu_workers(tmp_path):
    env = dict(os.environ, PYTENSOR_FLAGS="mode=FAST_COMPILE")
    png = tmp_path / "steps.png"
    args = ["--cpu", "--gpus", "2", "--image-size", "32", "--width", "4", "--blocks", "1,1,1,1",
            "--classes", "10", "--batch-size", "4", "--steps", "3", "--warmup", "1", "--plot", str(png)]
    proc = subprocess.run([sys.executable, str(DEMO), *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"2 rank\(s\) step \d: loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], proc.stdout
    assert re.search(r"Summary: .* images/s \(1 rank: [0-9.]+\), speedup [0-9.]+", proc.stdout), proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG" and "Curves written to %s" % png in proc.stdout
    # The runs' status lines reach the user (stderr), once per run, and nothing warns.
    assert proc.stderr.count("Synkhronos distributing functions...") == 2, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


def test_help():
    proc = subprocess.run([sys.executable, str(DEMO), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--batch-size" in proc.stdout and "--steps" in proc.stdout
