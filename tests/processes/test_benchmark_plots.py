"""The benchmarks' PNG pictures: every script writes one beside its JSON, and
``benchmarks/plot.py`` redraws them from JSON files.

The CPU benchmarks run for real at their smallest settings.  The GPU benchmarks
cannot run here, so their payloads are built by the scripts' own
``make_records`` / ``make_payload`` / ``child_result`` functions (the ones their
``main`` uses) from made-up timings, and drawn both in-process and by plot.py.
"""

import argparse
import ast
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
if BENCH not in sys.path:
    sys.path.append(BENCH)  # the scripts import _common and _plots as top-level modules

import _common  # noqa: E402
import _plots  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# (width, height) in pixels of each benchmark's picture.
PIXELS = {"bf16_loss_curve": (1200, 500), "call_overhead": (1500, 500), "collectives": (1300, 550),
          "cpu_backends": (1300, 500), "cpu_scaling": (1200, 500), "gpu_scaling": (1200, 500),
          "gpu_inputs": (1200, 500),
          "mpi_collectives": (1500, 500), "resnet50_profile": (1300, 500), "resnet50_scaling": (1200, 500),
          "soak": (1200, 500), "call_timeline": (1300, 410),  # call_timeline: one case
          "session_start": (1200, 500)}
ENV = dict(os.environ, PYTENSOR_FLAGS="mode=FAST_COMPILE")


def _script(name):
    """A benchmark script as a module (not run: its main is behind __name__)."""
    spec = importlib.util.spec_from_file_location("_bench_" + name, os.path.join(BENCH, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*argv, timeout=120):
    proc = subprocess.run([sys.executable, *argv], env=ENV, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    return proc


def _run_ok(*argv, timeout=120):
    proc = _run(*argv, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _check_png(path, kind):
    from matplotlib import image

    assert os.path.isfile(path), "no PNG at %s" % path
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    img = image.imread(path)
    width, height = PIXELS[kind]
    assert img.shape[:2] == (height, width)
    assert float(np.std(img[..., :3])) > 0.05  # something is drawn, not a blank canvas


def _machine(gpus=None):
    info = _common.machine_info()
    if gpus:
        info.update(gpus=gpus, gpu_name="NVIDIA H200")
    return info


# ------------------------------------------------------------ CPU benchmarks, run
def test_cpu_scaling_writes_png(tmp_path):
    out = str(tmp_path / "cpu_scaling.json")
    proc = _run_ok(os.path.join(BENCH, "cpu_scaling.py"), "--quick", "--ns", "2", "--no-procs",
                   "--batch", "256", "--steps", "2", "--out", out)
    png = str(tmp_path / "cpu_scaling.png")
    assert png in proc.stdout
    with open(out) as f:
        assert json.load(f)["benchmark"] == "cpu_scaling"
    _check_png(png, "cpu_scaling")


def test_call_overhead_writes_png(tmp_path):
    out = str(tmp_path / "call_overhead.json")
    proc = _run_ok(os.path.join(BENCH, "call_overhead.py"), "--quick", "--ranks", "1,2", "--calls", "100",
                   "--repeats", "1", "--scatter-mb", "8", "--gather-rows", "2048", "--sizes", "4,16",
                   "--mem-rows", "1000", "--out", out)
    png = str(tmp_path / "call_overhead.png")
    assert png in proc.stdout
    with open(out) as f:
        payload = json.load(f)
    assert payload["benchmark"] == "call_overhead"
    assert {"sessions", "memory", "target_a"} <= set(payload)  # every panel had data
    assert 0 < payload["shm_round_trip_us_median"] and 0 < payload["pipe_round_trip_us_median"]
    _check_png(png, "call_overhead")


def test_call_timeline_sees_every_process_and_writes_png(tmp_path):
    out = str(tmp_path / "call_timeline.json")
    proc = _run_ok(os.path.join(BENCH, "call_timeline.py"), "--ranks", "2", "--calls", "100",
                   "--cases", "tiny", "--out", out)
    assert str(tmp_path / "call_timeline.png") in proc.stdout
    with open(out) as f:
        payload = json.load(f)
    (result,) = payload["results"]
    steps = {(r["process"], r["what"]): r for r in result["rows"]}
    # The probes ran in the master and in the worker it spawned, on one clock.
    assert steps[("master", "call")]["start_us"] == 0 and result["calls"] == 100
    worker = steps[("worker 1", "run_whole")]
    assert 0 < worker["start_us"] < worker["end_us"] < steps[("master", "call")]["end_us"]
    _check_png(str(tmp_path / "call_timeline.png"), "call_timeline")


def test_soak_writes_png(tmp_path):
    out = str(tmp_path / "soak.json")
    proc = _run_ok(os.path.join(BENCH, "soak.py"), "--calls", "200", "--collectives", "40",
                   "--check-every", "50", "--out", out)
    png = str(tmp_path / "soak.png")
    assert png in proc.stdout
    with open(out) as f:
        payload = json.load(f)
    assert payload["benchmark"] == "soak" and len(payload["samples"]) >= 2
    _check_png(png, "soak")


def test_cpu_backends_child_and_png(tmp_path):
    """The likelihood workload runs for real (one timed step); the table's rows
    come from ``summarize`` over made-up cold and warm runs, drawn as the script does."""
    proc = _run_ok(os.path.join(BENCH, "cpu_backends.py"), "--_child", "likelihood", "--steps", "1")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT ")][-1]
    assert json.loads(line[9:])["step_s"] > 0
    mod = _script("cpu_backends")
    runs = [dict(round=r, workload=w, backend=b, cold=dict(wall_s=20.0 + r, work_s=1.0, unit="s/step"),
                 warm=dict(wall_s=5.0, work_s=1.0 if b == "numba" else 1.5 + r, unit="s/step"))
            for r in range(2) for w in ("mlp_demo", "likelihood") for b in mod.BACKENDS]
    summary = mod.summarize(runs, ["mlp_demo", "likelihood"])
    assert [s["jax_over_numba_work"] for s in summary] == [2.0, 2.0]  # medians of 1.5 and 2.5 over 1.0
    assert summary[0]["numba_cold_s"] == 20.5
    out = str(tmp_path / "cpu_backends.json")
    _common.write_results(out, {"benchmark": "cpu_backends", "machine": _machine(), "summary": summary,
                                "runs": runs, "settings": {"rounds": 2}})
    _check_png(out[:-5] + ".png", "cpu_backends")


def test_session_start_times_both_ways_and_writes_png(tmp_path):
    """Runs for real: one round of 3 sessions spawned and 3 forked by a template."""
    out = str(tmp_path / "session_start.json")
    _run_ok(os.path.join(BENCH, "session_start.py"), "--quick", "--out", out)
    with open(out) as f:
        payload = json.load(f)
    assert [s["method"] for s in payload["summary"]] == ["spawn", "template"]
    assert all(len(r["sessions"]) == 3 and r["sessions"][0]["fork"] > 0 for r in payload["runs"])
    _check_png(out[:-5] + ".png", "session_start")


def test_jax_batched_forms_agree_and_write_png(tmp_path):
    """Runs for real on JAX's CPU device: every form gives vmap's logp and gradient."""
    pytest.importorskip("jax")
    out = str(tmp_path / "jax_batched_forms.json")
    _run_ok(os.path.join(BENCH, "jax_batched_forms.py"), "--rows", "3000", "--points", "1,3",
            "--reps", "2", "--out", out)
    with open(out) as f:
        payload = json.load(f)
    assert payload["x64"] and payload["dtype"] == "float64"
    records = payload["records"]
    assert len(records) == 2 * 8 and all(r["rel_err"] < 1e-12 for r in records), records
    png = out[:-5] + ".png"
    assert os.path.getsize(png) > 10_000
    os.remove(png)
    _run_ok(os.path.join(BENCH, "plot.py"), out)  # drawn from the JSON alone, as the run drew it
    assert os.path.getsize(png) > 10_000


def test_rows_kernel_forms_agree_and_write_png(tmp_path):
    """Runs for real under Pallas's interpreter (no GPU here): the rows kernel
    with and without shared exponentials, its batched graph through XLA and
    every hand-written form give numpy's logp and gradient; so do the kernel
    and its batched graph of a Normal linear regression."""
    pytest.importorskip("pymc")  # (the kernel's forms are synkhronos.pymc's)
    pytest.importorskip("jax")
    out = str(tmp_path / "rows_kernel_forms.json")
    _run_ok(os.path.join(BENCH, "rows_kernel_forms.py"), "--rows", "700", "--points", "1,3", "--reps", "2",
            "--rounds", "1", "--out", out)
    with open(out) as f:
        got = json.load(f)
    records = got["records"]
    forms = {r["form"] for r in records}
    assert len(records) == 2 * len(forms)
    assert {"kernel", "kernel_apart", "xla", "hand_one_read", "fm_one_read"} <= forms
    assert set(got["floors"]) == {"read", "math_1", "math_3"}
    for r in records:
        assert r["rel_err"] < (1e-5 if r["form"] == "hand_f32_math" else 1e-12), r
    assert os.path.getsize(out[:-5] + ".png") > 10_000
    # A Normal linear regression: the kernel and its batched graph, numpy's values.
    _run_ok(os.path.join(BENCH, "rows_kernel_forms.py"), "--family", "normal", "--rows", "700",
            "--points", "1,2", "--reps", "2", "--rounds", "1", "--out", out)
    with open(out) as f:
        got = json.load(f)
    assert got["family"] == "normal" and {r["form"] for r in got["records"]} == {"kernel", "xla"}
    assert all(r["rel_err"] < 1e-12 for r in got["records"]), got["records"]


def test_pymc_libraries_draws_its_payload(tmp_path):
    """The library models' picture from a payload as the script writes it
    (running the models needs bambi or pymc-marketing and minutes)."""
    records = [{"model": m, "rows": 1000, "linker_timed": linker, "original_ms": [2.0, 2.2, 2.1],
                "copy_jax_ms": [1.9, 2.0, 2.1], "copy_timed_ms": [1.0, 1.1, 1.2]}
               for m, linker in (("bambi_normal", "Numba"), ("betageo", "C"))]
    out = str(tmp_path / "pymc_libraries.json")
    _common.write_results(out, {"benchmark": "pymc_libraries", "machine": _machine(), "records": records,
                                "settings": {"ranks": 2, "rows": 1000}})
    assert os.path.getsize(out[:-5] + ".png") > 10_000


def test_rows_kernel_blocks_draws_its_payload(tmp_path):
    """The block sizes' picture from a payload as the script writes it (the
    script needs a GPU), drawn again by plot.py from the JSON alone; the
    script's models are the PyMC models it names."""
    pm = pytest.importorskip("pymc")
    script = _script("rows_kernel_blocks")
    for name in script.MODELS:
        assert isinstance(script.build(name, 50), pm.Model)
    records = [{"model": m, "sums": sums, "block": b, "chosen": b == chosen, "ms_1": 0.3 + b / 1e4,
                "ms_4": 0.9 + b / 1e4} for m, sums, chosen in (("logistic", 7, 256), ("slopes", 42, 1024))
               for b in script.BLOCKS + (script.XLA,)]
    out = str(tmp_path / "rows_kernel_blocks.json")
    _common.write_results(out, {"benchmark": "rows_kernel_blocks", "machine": _machine(), "rows": 1e7,
                                "device": "NVIDIA H200", "jax": "0.11.2", "records": records})
    png = out[:-5] + ".png"
    assert os.path.getsize(png) > 10_000
    os.remove(png)
    _run_ok(os.path.join(BENCH, "plot.py"), out)
    assert os.path.getsize(png) > 10_000


def test_mpi_collectives_writes_png(tmp_path):
    """Runs for real at its smallest settings: raw mpi4py, synk under mpirun, synk on one host."""
    from _mpirun import MPIRUN

    if MPIRUN is None:
        pytest.skip("needs mpi4py and mpirun")
    out = str(tmp_path / "mpi_collectives.json")
    proc = _run_ok(os.path.join(BENCH, "mpi_collectives.py"), "--quick", "--out", out, timeout=300)
    records = json.load(open(out))["records"]
    settings = ("raw", "synk_mpi", "synk_host")
    # every setting ran every op and size (an all_gather's time is a difference of two
    # timings, which the noise of a loaded 2-core machine can make 0: no rate then)
    assert len(records) == 6 and all(r[s + "_ms"] is not None for r in records for s in settings)
    assert "synk, mpirun (host per rank)" in proc.stdout
    _check_png(out[:-5] + ".png", "mpi_collectives")


# ----------------------------------------------- GPU benchmarks, made-up timings
def _collectives_payload():
    mod = _script("collectives")
    n, sizes = 8, [mb * 2**20 for mb in (1, 16, 64, 256, 1024)]
    raw, synk_t = {}, {}
    for k, op in enumerate(mod.OPS):
        for nb in sizes:
            t = 20e-6 + nb / (150e9 + 10e9 * k)
            raw[(op, nb)] = (t, t * 1.3)
            slower = 1.0 + (0.02 + 0.04 * k) * (2**20 / nb) ** 0.25  # small sizes pay more
            synk_t[(op, nb)] = (t * slower, t * 1.6)
    records = mod.make_records(n, sizes, raw, synk_t)
    return mod.make_payload(_machine(gpus=n), dict(iters=100, repeats=3, split=16), records, True)


def _gpu_scaling_payload():
    mod = _script("gpu_scaling")
    args = mod.parse_args(["--precision", "tf32"])
    counts = [1, 2, 4, 8]
    results = {0: mod.child_result(0, [0.1000, 0.1010, 0.0990], 67_000_000)}
    for n in counts:
        results[n] = mod.child_result(n, [0.101 / n / (0.99 ** (n - 1))] * 3, 67_000_000)
    return mod.make_payload(_machine(gpus=8), args, results, counts)


def _resnet_payload(ddp_fails_at=None, ns=(1, 2, 4, 8)):
    mod = _script("resnet50_scaling")
    args = mod.parse_args([])
    ns = list(ns)
    results = {}
    for n in ns:
        results[("synk", n)] = mod.child_result([1000.0 * n * 0.985 ** (n - 1)] * 5, 40.0, 6.9)
        results[("ddp", n)] = (None if n == ddp_fails_at
                               else mod.child_result([1060.0 * n * 0.975 ** (n - 1)] * 5, 20.0, 6.9))
        results[("flax", n)] = mod.child_result([800.0 * n * 0.99 ** (n - 1)] * 5, 30.0, 6.9)
        if n > 1:  # --mpi runs from 2 ranks
            results[("synk_mpi", n)] = mod.child_result([990.0 * n * 0.985 ** (n - 1)] * 5, 45.0, 6.9)
    payload = mod.make_payload(_machine(gpus=8), args, ns, results)
    assert np.isclose(payload["results"][0]["synk_over_flax"], 1.25)
    if len(ns) < 3:
        return payload
    rec = payload["results"][2]  # 4 GPUs: --mpi's run against the single-host one
    assert np.isclose(rec["synk_mpi_over_synk"], 0.99)
    # Relative to the single-host 1-GPU figure.
    assert np.isclose(rec["synk_mpi_efficiency"], 0.99 * 0.985 ** 3)
    return payload


def _resnet_profile_payload():
    mod = _script("resnet50_profile")
    args = mod.parse_args([])
    names = ["sm90_xmma_fprop_implicit_gemm_bf16", "input_reduce_fusion.3", "loop_add_fusion",
             "loop_transpose_fusion", "input_scatter_fusion", "nvjet_hsh_gemm", "memset32"]
    results = {}
    for side, scale in (("synk", 1.2), ("flax", 1.0)):
        kernels = [(name, 1000.0 * scale * (i + 1)) for i, name in enumerate(names) for _ in range(3)]
        res = mod.summarize(kernels, steps=3)
        res.update(wall_ms_per_step=res["gpu_ms_per_step"] + 2.0, setup_s=30.0,
                   images_per_s=256 / res["gpu_ms_per_step"] * 1e3)
        results[side] = res
    assert set(results["flax"]["ms_per_step"]) == {
        "convolutions", "reduction fusions", "elementwise fusions", "layout (transposes, copies)", "pooling",
        "matrix products", "memset"}
    assert np.isclose(results["flax"]["gpu_ms_per_step"], 28.0)
    return {"benchmark": "resnet50_profile", "machine": _machine(gpus=1), "args": vars(args),
            "results": results}


def _call_overhead_gpu_payload():
    mod = _script("call_overhead")
    args = mod._parse(["--quick"])
    args.gpu, args.ranks, args.parts = True, [1, 2, 4, 8], "ab"  # as --gpu on an 8-GPU machine
    rng = np.random.default_rng(0)
    sessions = []
    for n in args.ranks:
        plain = list(60e-6 + 5e-6 * rng.random(100))
        synk = list(120e-6 + 10e-6 * n + 20e-6 * rng.random(100))
        cold = [t * 1.5 for t in synk]
        times = {"synk": [0.004 / n] * 3, "plain_gather_sum": [0.006] * 3, "np_take": [0.004] * 3,
                 "memcpy": [0.001] * 3}
        sessions.append({"ranks": n, "a": mod.overhead_stats(synk, plain, cold, plain, True),
                         "b": mod.scatter_stats(times, 32768, 8192, True)})
    return mod.make_payload(_machine(gpus=8), args, sessions, {"socket": [40e-6] * 10, "shm": [12e-6] * 10},
                            None, [])


def _bf16_loss_curve_payload():
    mod = _script("bf16_loss_curve")
    args = mod.parse_args([])
    steps = np.arange(200)
    runs = {"highest": {"losses": list(7.0 * np.exp(-steps / 60)), "images_per_s": 800.0},
            "bf16": {"losses": list(7.0 * np.exp(-steps / 58)), "images_per_s": 2600.0}}
    payload = mod.make_payload(_machine(gpus=1), args, runs)
    assert np.allclose(payload["difference"], np.array(runs["bf16"]["losses"]) - runs["highest"]["losses"])
    return payload


def _gpu_inputs_payload():
    mod = _script("gpu_inputs")
    args = argparse.Namespace(sizes=[0.0625, 1, 16, 128], ranks=[1, 2], repeats=3)
    records = [dict(ranks=n, side=side, mb=mb, ms=ms, gbps=mb * 2**20 / ms / 1e6, same_result=True,
                    data_locked=mb >= 1)
               for n in args.ranks for mb in args.sizes
               for side, ms in (("plain_pageable", 0.2 + mb / 5), ("plain_locked", 0.2 + mb / 45),
                                ("synk", 0.3 + mb / 45 / n), ("plain_gathered", 0.2 + mb / 3),
                                ("synk_gathered", 0.3 + mb / 10 / n))]
    payload = mod.make_payload(_machine(gpus=2), args, records)
    rows = mod._table_rows(records)
    assert len(rows) == 8 and rows[-1][7] == "%.2fx" % ((0.2 + 128 / 5) / (0.3 + 128 / 90))
    assert rows[-1][8] == "%.2fx" % ((0.2 + 128 / 3) / (0.3 + 128 / 20))
    return payload


GPU_PAYLOADS = {
    "bf16_loss_curve": _bf16_loss_curve_payload,
    "gpu_inputs": _gpu_inputs_payload,
    "collectives": _collectives_payload,
    "gpu_scaling": _gpu_scaling_payload,
    "resnet50_scaling": _resnet_payload,
    "resnet50_profile": _resnet_profile_payload,
    "call_overhead": _call_overhead_gpu_payload,
}


@pytest.mark.parametrize("kind", sorted(GPU_PAYLOADS))
def test_gpu_payload_draws(tmp_path, kind, capsys):
    payload = GPU_PAYLOADS[kind]()
    assert payload["benchmark"] == kind
    path = str(tmp_path / (kind + ".json"))
    _common.write_results(path, payload)  # what the script does after its run
    png = str(tmp_path / (kind + ".png"))
    captured = capsys.readouterr()
    assert png in captured.out, captured.err
    _check_png(png, kind)


def test_resnet_failed_run_still_draws(tmp_path):
    path = str(tmp_path / "resnet50_scaling.json")
    png = _plots.write_plot(path, _resnet_payload(ddp_fails_at=4), required=True)
    _check_png(png, "resnet50_scaling")


@pytest.mark.parametrize("ddp_fails", [False, True])
def test_resnet_one_gpu_draws_bars(tmp_path, ddp_fails):
    path = str(tmp_path / "resnet50_scaling.json")
    png = _plots.write_plot(path, _resnet_payload(ddp_fails_at=1 if ddp_fails else None, ns=[1]),
                            required=True)
    _check_png(png, "resnet50_scaling")


def test_profile_unknown_side_is_named():
    script = os.path.join(BENCH, "resnet50_profile.py")
    proc = subprocess.run([sys.executable, script, "--sides", "synk,torch"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "--sides: unknown side(s) torch; choose from synk, flax" in proc.stderr


def test_resnet_unknown_peer_is_named():
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "resnet50_scaling.py"), "--peers", "ddp,jaxx"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--peers: unknown side(s) jaxx; choose from ddp, flax" in proc.stderr


def test_plot_cli_redraws_gpu_json(tmp_path):
    paths = []
    for kind, build in sorted(GPU_PAYLOADS.items()):
        payload = build()
        if kind == "collectives":  # a file from before the scripts recorded their name
            del payload["benchmark"]
            kind = "collectives_h200"
        paths.append(str(tmp_path / (kind + ".json")))
        _common.write_json(paths[-1], payload)
    proc = _run_ok(os.path.join(BENCH, "plot.py"), *paths)
    for path in paths:
        png = _plots.png_path(path)
        assert png in proc.stdout
        _check_png(png, os.path.basename(path).split(".")[0].replace("_h200", ""))


# ------------------------------------------------------------------ the layout
def test_no_helper_module_imports_a_script():
    """The underscore modules (shared machinery, pictures, parts of a benchmark)
    import no benchmark script: the scripts stand above them, so that no import
    runs in a circle and plot.py draws without a script's dependencies."""
    scripts = {f[:-3] for f in os.listdir(BENCH) if f.endswith(".py") and not f.startswith("_")}
    for name in sorted(f for f in os.listdir(BENCH) if f.startswith("_") and f.endswith(".py")):
        with open(os.path.join(BENCH, name)) as f:
            tree = ast.parse(f.read())
        nodes = list(ast.walk(tree))
        imported = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & scripts, "%s imports the script(s) %s" % (name, sorted(imported & scripts))


# ------------------------------------------------------------------ bad input
def test_plot_cli_bad_input(tmp_path):
    missing = str(tmp_path / "missing.json")
    unknown = str(tmp_path / "cpu_scaling.json")
    _common.write_json(unknown, {"benchmark": "no_such_benchmark", "machine": {}})
    nameless = str(tmp_path / "results.json")
    _common.write_json(nameless, {"machine": {}})
    proc = _run(os.path.join(BENCH, "plot.py"), missing, unknown, nameless)
    assert proc.returncode == 1
    assert "%s: no such file" % missing in proc.stderr
    assert unknown in proc.stderr and "'no_such_benchmark'" in proc.stderr
    assert nameless in proc.stderr and "'results'" in proc.stderr
    assert not list(tmp_path.glob("*.png"))


def test_benchmark_name():
    assert _plots.benchmark_name("x/soak.json", {}) == "soak"
    assert _plots.benchmark_name("x/anything.json", {"benchmark": "soak"}) == "soak"
    assert _plots.benchmark_name("x/resnet50_scaling_tf32.json", {}) == "resnet50_scaling"
    assert _plots.benchmark_name("x/soak.json", {}, kind="gpu_scaling") == "gpu_scaling"
    with pytest.raises(ValueError, match="x/bogus.json"):
        _plots.benchmark_name("x/bogus.json", {})


def test_without_matplotlib_json_still_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = str(tmp_path / "gpu_scaling.json")
    _common.write_results(path, _gpu_scaling_payload())
    out = capsys.readouterr().out
    with open(path) as f:
        assert json.load(f)["benchmark"] == "gpu_scaling"
    assert not os.path.exists(_plots.png_path(path))
    skipped = [ln for ln in out.splitlines() if "PNG skipped" in ln]
    assert len(skipped) == 1 and "matplotlib" in skipped[0] and "pip install matplotlib" in skipped[0]
    with pytest.raises(ImportError, match="pip install matplotlib"):
        _plots.write_plot(path, _gpu_scaling_payload(), required=True)
