"""Run by ``tests/faults/test_shm_room.py`` in a mount namespace of its own,
where /dev/shm is a tmpfs of ``ROOM_MB`` (a Docker container's default):
every way a session puts arrays in shared memory meets a /dev/shm too small
for them.  Prints one JSON object: what each step raised or returned, and
what numpy says it should have returned."""

import json
import os
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

ROOM_MB = 64
SHM = "/dev/shm"
F32 = "float32"


def _raised(fn):
    try:
        fn()
    except Exception as e:  # what the user sees, as the user sees it
        return {"type": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e)}
    return None


def _allocated(name):
    """Bytes /dev/shm holds for segment ``name`` (tmpfs counts the pages in blocks)."""
    return os.stat(SHM + name).st_blocks * 512


def main():
    out = {}
    pytensor.config.floatX = F32
    synk.fork(2)
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
    synk.scatter(s, np.ones((6, 3), F32))
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
    out["fork_full"] = _raised(lambda: synk.fork(2))
    out["left_after_fork"] = sorted(n for n in os.listdir(SHM) if n.startswith("synk_"))
    os.remove(os.path.join(SHM, "filler"))
    synk.fork(2)
    synk.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
