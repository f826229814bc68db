"""Where one GPU's time goes in a ResNet-50 training step: Synkhronos against the
same model written in Flax (``_flax_resnet``), same batch and precision, same run.

Each side runs in its own process: a few untimed steps (compilation), then
``--steps`` steps under JAX's profiler.  The GPU kernels of the trace are summed by
category (convolutions and matrix products, reduction fusions such as batch-norm
statistics, elementwise fusions, layout changes: transposes and copies, other),
per step, beside the step's wall time; the table shows both sides and the largest
kernels of each.  ``--hlo`` also keeps XLA's optimized HLO of each side's largest
module (``<out>.<side>.hlo.txt``), to read the fusions and dtypes behind the figures.
Synkhronos's step is ``resnet50_scaling.py``'s (its ``--layout`` and precision);
``--precision`` is shared by both sides.
"""

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from _common import default_out, gpu_name, machine_info, median, print_machine, table, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = ("synk", "flax")


def category(kernel):
    """The category of a GPU kernel, by its name: XLA names its fusions after their
    kind (``loop_*``/``input_*_fusion``: reductions have ``reduce`` in the name);
    cuDNN's and cuBLAS's kernel names say what they compute (fprop, dgrad, wgrad, gemm)."""
    name = kernel.lower()
    if any(k in name for k in ("nchwtonhwc", "nhwctonchw", "transpose", "copy", "memcpy")):
        return "layout (transposes, copies)"
    if "memset" in name:
        return "memset"
    if any(k in name for k in ("scatter", "reduce_window", "select_and")):
        return "pooling"
    if "gemm_fusion" in name or "triton" in name:
        return "matrix products"
    if "fusion" in name or name.startswith(("loop_", "input_", "wrapped_")):
        return "reduction fusions" if "reduce" in name else "elementwise fusions"
    if any(k in name for k in ("fprop", "dgrad", "wgrad", "convolution", "implicit_gemm", "cudnn", "conv2d")):
        return "convolutions"
    if any(k in name for k in ("gemm", "nvjet", "cutlass", "cublas", "matmul")):
        return "matrix products"
    return "other"


def device_kernels(trace):
    """``(name, microseconds)`` of every GPU kernel in a Perfetto/Chrome trace (the
    JSON JAX's profiler writes): complete events on a GPU's stream lines, not the
    derived "XLA Ops"/"XLA Modules" lines that repeat them."""
    procs, threads = {}, {}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            procs[ev["pid"]] = str(ev.get("args", {}).get("name", ""))
        elif ev.get("ph") == "M" and ev.get("name") == "thread_name":
            threads[(ev["pid"], ev["tid"])] = str(ev.get("args", {}).get("name", ""))
    gpu = {pid for pid, name in procs.items() if "gpu" in name.lower()}
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("pid") not in gpu:
            continue
        line = threads.get((ev["pid"], ev.get("tid")), "")
        if line.lower().startswith("stream"):
            out.append((ev.get("name", "?"), float(ev.get("dur", 0.0))))
    return out


def summarize(kernels, steps):
    """Milliseconds per step by category and by kernel name (largest first)."""
    by_cat, by_name = {}, {}
    for name, us in kernels:
        by_name[name] = by_name.get(name, 0.0) + us / 1e3 / steps
    for name, ms in by_name.items():
        by_cat[category(name)] = by_cat.get(category(name), 0.0) + ms
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
    return dict(ms_per_step=by_cat, gpu_ms_per_step=sum(by_cat.values()),
                kernels_per_step=len(kernels) / steps,
                kernels=[dict(name=n, ms_per_step=ms, category=category(n)) for n, ms in ranked])


def child(args):
    """One side: time and profile its steps; printed as JSON."""
    t0 = time.perf_counter()
    if args.child == "synk":
        import resnet50_scaling

        sargs = resnet50_scaling.parse_args(["--batch-size", str(args.batch_size), "--layout", args.layout,
                                             "--precision", args.precision, "--blocks", args.blocks])
        step, finish = resnet50_scaling.synk_step(sargs, 1)
    else:
        from _flax_resnet import flax_step

        blocks = [int(b) for b in args.blocks.split(",")]
        step, _ = flax_step(blocks, 1000, args.batch_size, 224, args.precision)
        finish = lambda: None  # noqa: E731
    import jax

    try:
        for _ in range(args.warmup):
            step()
        setup = time.perf_counter() - t0
        walls = []
        for _ in range(args.steps):  # unprofiled: the images/s
            t = time.perf_counter()
            step()
            walls.append(time.perf_counter() - t)
        logdir = tempfile.mkdtemp(prefix="profile-")
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            for _ in range(args.steps):
                step()
        paths = glob.glob(os.path.join(logdir, "**", "*.trace.json.gz"), recursive=True)
        with gzip.open(max(paths, key=os.path.getmtime)) as f:
            kernels = device_kernels(json.load(f))
        shutil.rmtree(logdir, ignore_errors=True)
    finally:
        finish()
    wall = median(walls)
    return dict(summarize(kernels, args.steps), wall_ms_per_step=wall * 1e3,
                images_per_s=args.batch_size / wall, setup_s=setup)


def _largest_hlo(dump_dir, dest):
    paths = glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
    if paths:
        shutil.copyfile(max(paths, key=os.path.getsize), dest)
        return dest
    return None


def run_side(side, argv, args):
    """One side in its own process (its own XLA flags); its result dict or None."""
    env = dict(os.environ)
    dump = tempfile.mkdtemp(prefix="hlo-") if args.hlo else None
    if dump:
        dump_flags = " --xla_dump_to=%s --xla_dump_hlo_as_text" % dump
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + dump_flags).strip()
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", side] + argv
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not line:
        print("  %s failed:\n%s" % (side, out.stderr[-3000:]), flush=True)
        return None
    result = json.loads(line[0][7:])
    if dump:
        base = os.path.splitext(args.out or default_out(__file__))[0]
        result["hlo"] = _largest_hlo(dump, "%s.%s.hlo.txt" % (base, side))
        result["hlo_summary"] = hlo_summary(result["hlo"]) if result["hlo"] else None
        shutil.rmtree(dump, ignore_errors=True)
    return result


def hlo_summary(path):
    """Counts in an optimized HLO module (its entry computation): fusions,
    convolution custom calls, copies and transposes, and the bytes of the arrays
    the fusions write, by dtype (every element of a multi-output fusion)."""
    text = open(path).read()
    entry = text[text.index("\nENTRY"):]
    sizes = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "pred": 1, "f64": 8, "u8": 1}
    written = {}
    for shapes in re.findall(r"^\s*(?:ROOT )?%\S+ = (\(.*?\)|\w+\[[\d,]*\]\S*) fusion\(", entry, re.M):
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
            n = 1
            for d in filter(None, dims.split(",")):
                n *= int(d)
            written[dtype] = written.get(dtype, 0) + n * sizes.get(dtype, 4)
    return dict(fusions=len(re.findall(r" fusion\(", entry)),
                convolutions=len(re.findall(r'custom_call_target="__cudnn\$conv', entry)),
                copies=len(re.findall(r"^\s*%\S+ = \S+ copy\(", entry, re.M)),
                transposes=len(re.findall(r"^\s*%\S+ = \S+ transpose\(", entry, re.M)),
                fusion_output_gb_by_dtype={k: v / 1e9 for k, v in written.items()})


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", choices=("highest", "tf32", "bf16"), default="bf16")
    p.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW")
    p.add_argument("--blocks", default="3,4,6,3")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--hlo", action="store_true", help="keep each side's optimized HLO beside the JSON")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--out", default=None)
    p.add_argument("--_child", dest="child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    unknown = sorted(set(args.sides.split(",")) - set(SIDES))
    if unknown:
        raise SystemExit("--sides: unknown side(s) %s; choose from %s"
                         % (", ".join(unknown), ", ".join(SIDES)))
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return None
    info = machine_info()
    info["gpu_name"] = gpu_name()
    print_machine(info)
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    results = {side: run_side(side, passed, args) for side in args.sides.split(",")}
    ran = [s for s in results if results[s]]
    cats = sorted({c for s in ran for c in results[s]["ms_per_step"]},
                  key=lambda c: -max(results[s]["ms_per_step"].get(c, 0) for s in ran))
    rows = [[c] + ["%.2f" % results[s]["ms_per_step"].get(c, 0.0) for s in ran] for c in cats]
    rows += [["GPU kernels, total"] + ["%.2f" % results[s]["gpu_ms_per_step"] for s in ran],
             ["step, wall"] + ["%.2f" % results[s]["wall_ms_per_step"] for s in ran],
             ["kernels per step"] + ["%.0f" % results[s]["kernels_per_step"] for s in ran],
             ["images/s"] + ["%.0f" % results[s]["images_per_s"] for s in ran]]
    print("\nResNet (blocks %s), batch %d, precision %s, synk layout %s: ms per step by kernel category"
          % (args.blocks, args.batch_size, args.precision, args.layout))
    print(table(["category"] + ran, rows))
    for s in ran:
        print("\n%s, largest kernels (ms per step):" % s)
        print(table(["kernel", "category", "ms"], [[k["name"][:90], k["category"], "%.2f" % k["ms_per_step"]]
                                                    for k in results[s]["kernels"][:12]]))
        if results[s].get("hlo_summary"):
            print("%s optimized HLO: %s" % (s, json.dumps(results[s]["hlo_summary"])))
    write_results(args.out or default_out(__file__), {"benchmark": "resnet50_profile", "machine": info,
                                                       "args": vars(args), "results": results})
    return results


if __name__ == "__main__":
    main()
