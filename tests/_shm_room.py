"""A session in a /dev/shm too small for its arrays (the tests in
``faults/test_shm_room.py`` and ``gpu/test_gpu_shm_room.py``).

``in_small_dev_shm`` runs this file in a child with a mount namespace of its
own, where /dev/shm is a tmpfs of ``ROOM_MB`` (a Docker container's
default), and returns what the child printed: what each way a session puts
arrays in shared memory raised or returned there, and what numpy says it
should have returned.  On CPU ranks (2), or on every visible GPU (with one,
no array leaves the master's process but the Data's)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

ROOM_MB = 64
SHM = "/dev/shm"
F32 = "float32"
MOUNT = "mount -t tmpfs -o size=%dm tmpfs %s && exec %s %s" % (ROOM_MB, SHM, sys.executable,
                                                                os.path.abspath(__file__))


def _namespace():
    """The ``unshare`` command that gives a child its own /dev/shm here, or None."""
    if shutil.which("unshare") is None:
        return None
    for args in (["unshare", "-m"], ["unshare", "-rm"]):  # root; an unprivileged user namespace
        if subprocess.run(args + ["sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                          capture_output=True).returncode == 0:
            return args
    return None


def in_small_dev_shm(device="cpu"):
    """What the child saw in a 64 MB /dev/shm, on ``device`` ranks ("cpu" or "gpu")."""
    args = _namespace()
    if args is None:
        pytest.skip("no mount namespace here (unshare -m / -rm) to give a child a 64 MB /dev/shm")
    proc = subprocess.run(args + ["sh", "-c", MOUNT + " " + device], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, "the child died (%d; SIGBUS is -7 or 135):\n%s" % (
        proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _raised(fn):
    try:
        fn()
    except Exception as e:  # what the user sees, as the user sees it
        return {"type": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e)}
    return None


def _allocated(name):
    """Bytes /dev/shm holds for segment ``name`` (tmpfs counts the pages in blocks)."""
    return os.stat(SHM + name).st_blocks * 512


def main(gpu):
    out = {}
    pytensor.config.floatX = F32
    out["ranks"] = synk.fork(None if gpu else 2, use_gpu=gpu)
    x = pt.matrix("x")
    s = pytensor.shared(np.zeros((4, 3), F32), name="s")
    total = synk.function([x], x.mean() + s.sum())
    wide = synk.function([x], (pt.tile(x, (1, 10)), None))  # each rank returns 10 times its rows
    synk.distribute()
    small = np.arange(30, dtype=F32).reshape(10, 3)
    small_data = synk.data(small)

    out["data"] = _raised(lambda: synk.data(np.ones(20_000_000, F32)))  # 80 MB
    out["scatter"] = _raised(lambda: synk.scatter(s, np.ones((20_000_000, 3), F32)))  # 240 MB
    big = synk.data(np.ones((1_500_000, 3), F32))  # 18 MB: each worker's output 90 MB
    out["outputs"] = _raised(lambda: wide(big))
    big.free_memory()
    # The session goes on: a scatter and a call that fit.
    synk.scatter(s, np.ones((3 * out["ranks"], 3), F32))
    out["after"] = [float(total(small_data)), float(small.mean() + 3 * 3)]  # 3 rows of s a rank
    # An oversized Data holds in /dev/shm the rows it has, not the room it keeps.
    roomy = synk.data(np.ones((1_000_000, 3), F32), oversize=2)
    out["oversized"] = [_allocated(roomy._memory.segment.name), roomy.data.nbytes]
    roomy.set_length(1_900_000)  # within the room: reserved as it is used
    out["grown"] = [_allocated(roomy._memory.segment.name), roomy.data.nbytes]
    roomy.data[:] = 2
    out["regrown"] = _raised(lambda: roomy.set_length(30_000_000))  # past the room: 360 MB
    out["kept"] = [list(roomy.shape), float(roomy.data.sum()), 2.0 * 1_900_000 * 3]
    synk.close()
    out["left_after_close"] = sorted(n for n in os.listdir(SHM) if n.startswith("synk_"))

    with open(os.path.join(SHM, "filler"), "wb") as f:  # /dev/shm full
        f.write(b"\0" * (ROOM_MB << 20))
    out["fork_full"] = _raised(lambda: synk.fork(None if gpu else 2, use_gpu=gpu))
    synk.close()  # (one GPU rank alone needs no shared memory: that session started)
    out["left_after_fork"] = sorted(n for n in os.listdir(SHM) if n.startswith("synk_"))
    os.remove(os.path.join(SHM, "filler"))
    synk.fork(None if gpu else 2, use_gpu=gpu)
    synk.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:] == ["gpu"])
