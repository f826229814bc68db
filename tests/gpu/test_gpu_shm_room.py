"""GPU ranks in a /dev/shm too small for the arrays (a Docker container started
without ``--shm-size``): ``OSError`` (ENOSPC) where the CPU ranks raise it,
never SIGBUS (see ``tests/faults/test_shm_room.py``)."""

import pytest
from _shm_room import in_small_dev_shm

pytestmark = pytest.mark.gpus(1)


def test_gpu_ranks_in_a_small_dev_shm_raise_and_go_on():
    room = in_small_dev_shm("gpu")
    for step in ["data", "regrown"]:
        assert room[step] is not None and room[step]["errno"] == 28, (step, room[step])
    if room["ranks"] > 1:  # arrays leave the master's process, and workers talk through /dev/shm
        assert room["scatter"]["errno"] == 28 and room["outputs"]["type"] == "WorkerError"
        assert room["fork_full"]["errno"] == 28
    got, want = room["after"]
    assert got == pytest.approx(want, rel=1e-6)
    assert room["left_after_close"] == [] and room["left_after_fork"] == []
