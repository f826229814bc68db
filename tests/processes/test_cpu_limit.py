"""A CPU limit (``docker run --cpus``, a Kubernetes CPU limit: a cgroup's CPU
quota) counts as the cores a process may use: ``fork()`` starts a rank per
core the limit allows, not per core of the host.

The cgroup files are read from made-up trees here (cgroup v1 and v2, nested
limits, a container's own mount); where this process may make a cgroup (root,
with the cpu controller), a child in a cgroup of one CPU's time forks its
default session."""

import json
import os
import subprocess
import sys
import time

import pytest

from synkhronos._common.cores import cpu_quota, usable_cores

CGROUP = "/sys/fs/cgroup"


def _tree(tmp_path, cgroup_lines, mounts, files):
    """A fake ``/proc/self`` (its ``cgroup`` and ``mountinfo``) and cgroup
    files under ``tmp_path``; mount points and file paths are relative to it."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("".join(line + "\n" for line in cgroup_lines))
    info = ["%d 1 0:%d %s %s rw - %s cgroup rw,%s" % (30 + i, 30 + i, root, tmp_path / point, kind, opts)
            for i, (root, point, kind, opts) in enumerate(mounts)]
    (proc / "mountinfo").write_text("25 1 0:20 / / rw - ext4 /dev/sda rw\n" + "\n".join(info) + "\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return str(proc)


def test_cgroup_v2_quota_and_no_limit(tmp_path):
    proc = _tree(tmp_path, ["0::/user/job"], [("/", "cg", "cgroup2", "nsdelegate")],
                 {"cg/user/job/cpu.max": "150000 100000\n", "cg/user/cpu.max": "max 100000\n"})
    assert cpu_quota(proc) == pytest.approx(1.5)
    (tmp_path / "cg/user/job/cpu.max").write_text("max 100000\n")
    assert cpu_quota(proc) is None


def test_the_least_limit_along_the_path_counts(tmp_path):
    proc = _tree(tmp_path, ["0::/a/b"], [("/", "cg", "cgroup2", "")],
                 {"cg/a/b/cpu.max": "800000 100000\n", "cg/a/cpu.max": "200000 100000\n",
                  "cg/cpu.max": "max 100000\n"})
    assert cpu_quota(proc) == pytest.approx(2.0)


def test_cgroup_v1_quota_and_none(tmp_path):
    mounts = [("/", "cpu", "cgroup", "cpu,cpuacct"), ("/", "cpuset", "cgroup", "cpuset")]
    lines = ["4:cpu,cpuacct:/docker/abc", "3:cpuset:/docker/abc", "0::/"]
    files = {"cpu/docker/abc/cpu.cfs_quota_us": "300000\n", "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
             "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    proc = _tree(tmp_path, lines, mounts, files)
    assert cpu_quota(proc) == pytest.approx(3.0)
    (tmp_path / "cpu/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(proc) is None


def test_a_containers_own_cgroup_mounted_at_the_root(tmp_path):
    # cgroup v1 without a cgroup namespace: /proc/self/cgroup names the container's
    # cgroup from the host, and the mount shows that cgroup itself.
    proc = _tree(tmp_path, ["4:cpu:/docker/abc"], [("/docker/abc", "cpu", "cgroup", "cpu")],
                 {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(proc) == pytest.approx(0.5)


def test_nothing_to_read_means_no_limit(tmp_path):
    assert cpu_quota(str(tmp_path / "absent")) is None
    proc = _tree(tmp_path, ["0::/"], [("/", "cg", "cgroup2", "")], {"cg/cpu.max": "garbage\n"})
    assert cpu_quota(proc) is None


# ------------------------------------------------- a real cgroup of one CPU


def _one_cpu_cgroup():
    """A new cgroup limited to one CPU's time (its directory), or None where
    this process cannot make one."""
    v1 = os.path.join(CGROUP, "cpu")
    try:
        with open(os.path.join(CGROUP, "cgroup.subtree_control")) as f:
            v2 = "cpu" in f.read().split()
    except OSError:
        v2 = False
    if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
        base, limit = v1, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
    elif v2:
        base, limit = CGROUP, {"cpu.max": "100000 100000"}
    else:
        return None
    path = os.path.join(base, "synk_test_%d" % os.getpid())
    try:
        os.mkdir(path)
    except OSError:
        return None
    try:
        for name, value in limit.items():
            with open(os.path.join(path, name), "w") as f:
                f.write(value)
    except OSError:
        os.rmdir(path)
        return None
    return path


def _remove(path):
    """Remove cgroup ``path`` once its last process (the template, which ends
    when its session's process has) is gone."""
    for _ in range(100):
        try:
            return os.rmdir(path)
        except OSError:
            time.sleep(0.1)
    os.rmdir(path)


CHILD = """
import json, sys
import synkhronos as synk
from synkhronos._common.cores import usable_cores
n = synk.fork(use_gpu=False)
synk.close()
print(json.dumps([usable_cores(), n]))
"""


def test_fork_starts_a_rank_per_core_the_limit_allows():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a limit of one CPU changes nothing here")
    path = _one_cpu_cgroup()
    if path is None:
        pytest.skip("no cgroup with a CPU quota can be made here (needs root and the cpu controller)")
    try:
        cmd = 'echo $$ > %s/cgroup.procs && exec "$0" -c "$1"' % path
        proc = subprocess.run(["sh", "-c", cmd, sys.executable, CHILD], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        cores, ranks = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        _remove(path)
    assert (cores, ranks) == (1, 1)
    assert usable_cores() >= 2  # this process, outside the cgroup, still has them
