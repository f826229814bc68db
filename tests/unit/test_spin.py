"""How long a process polls for its next message before it sleeps: the device's
default (GPU ranks poll longer: their calls take hundreds of microseconds), or
``$SYNKHRONOS_SPIN_US`` for every device."""

import pytest

from synkhronos._common.env import SPIN_DEFAULT, SPIN_ENV, spin_seconds
from synkhronos._devices import cpu, gpu


@pytest.mark.parametrize("device, default", [(cpu.CpuDevice, SPIN_DEFAULT), (gpu.GpuDevice, gpu.GPU_SPIN_S)])
def test_each_device_has_its_default_and_the_variable_wins(monkeypatch, device, default):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    assert spin_seconds(device.spin_s) == default
    monkeypatch.setenv(SPIN_ENV, "250")
    assert spin_seconds(device.spin_s) == pytest.approx(250e-6)


def test_gpu_ranks_poll_longer_than_a_gpu_call_takes():
    assert gpu.GpuDevice.spin_s >= 1e-3 > cpu.CpuDevice.spin_s


# ----------------------------------------------- the master's rule for its workers
class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _spins(monkeypatch, gaps, **kwargs):
    """What ``WorkerSpin`` sends after requests spaced by ``gaps`` (seconds)."""
    from synkhronos._common import waiting

    clock = _Clock()
    monkeypatch.setattr(waiting.time, "perf_counter", clock)
    rule = waiting.WorkerSpin(100e-6, **kwargs)
    sent = []
    for gap in gaps:
        rule.replied()
        clock.now += gap
        sent.append(rule.next())
    return sent


def test_workers_poll_through_short_gaps_between_requests(monkeypatch):
    sent = _spins(monkeypatch, [300e-6] * 8)
    assert sent[:3] == [100e-6] * 3, "too few gaps seen: the device's poll"
    assert sent[-1] == pytest.approx(600e-6), "twice the median gap"
    mixed = _spins(monkeypatch, [200e-6, 5.0, 250e-6, 300e-6, 1.0, 220e-6, 260e-6, 240e-6])
    assert mixed[-1] == pytest.approx(2 * 260e-6, rel=1e-6), "the median: a pause does not count"


@pytest.mark.parametrize("gap, why", [(1.5e-3, "twice the gap is over the cap"),
                                      (30e-6, "the device's poll covers it")])
def test_gaps_a_poll_would_not_bridge_keep_the_devices_poll(monkeypatch, gap, why):
    assert _spins(monkeypatch, [gap] * 8)[-1] == 100e-6, why


def test_a_spin_the_user_set_or_crowded_cores_keep_the_devices_poll(monkeypatch):
    assert _spins(monkeypatch, [300e-6] * 8, fixed=True)[-1] == 100e-6
    asked = []
    sent = _spins(monkeypatch, [300e-6] * 8, crowded=lambda: asked.append(1) or True)
    assert sent[-1] == 100e-6 and len(asked) == 1, "crowding is asked at most every half second"


def test_crowded_cores(monkeypatch):
    from synkhronos._common import waiting

    monkeypatch.setattr(waiting.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert not waiting.cores_crowded(2, 2)
    assert waiting.cores_crowded(3, 2), "the session's ranks and children outnumber the cores"
    monkeypatch.setattr(waiting.os, "getloadavg", lambda: (3.5, 1.0, 1.0))
    assert waiting.cores_crowded(2, 2), "other processes load the host"


def test_each_command_carries_the_spin_and_a_worker_takes_it():
    import collections
    import types

    from synkhronos._session import worker
    from synkhronos._session.dispatch import Dispatcher
    from synkhronos._wire.protocol import Exit

    class Channel:
        spin = 100e-6

        def __init__(self):
            self.sent = []

        def send(self, message):
            self.sent.append(message)

        def recv(self):
            return self.sent.pop(0)

    channel = Channel()
    handle = types.SimpleNamespace(channel=channel, pending_drops=collections.deque(), busy=False, since=0,
                                   owed=collections.deque(), asked=None)
    d = Dispatcher(lambda: None, lambda: None)
    d.workers = {1: handle}
    d.spin.base = 0.0042
    d._deliver(Exit(False), [1])
    assert channel.sent[0][-1] == 0.0042
    exchange = types.SimpleNamespace(release=lambda: None)
    state = types.SimpleNamespace(exchange=exchange, drop=lambda name: None)
    assert worker.serve_commands(channel, state, None) is False  # (EXIT: the session did not fail)
    assert channel.spin == 0.0042


@pytest.mark.parametrize("value, fixed", [(None, False), ("  ", False), ("250", True)])
def test_the_workers_poll_is_fixed_only_where_the_user_set_one(monkeypatch, value, fixed):
    """A blank ``$SYNKHRONOS_SPIN_US`` is unset, as ``spin_seconds`` reads it."""
    import synkhronos as synk
    from synkhronos._session import runtime

    if value is None:
        monkeypatch.delenv(SPIN_ENV, raising=False)
    else:
        monkeypatch.setenv(SPIN_ENV, value)
    synk.fork(1, use_gpu=False)
    try:
        assert runtime.require().dispatcher.spin.fixed is fixed
    finally:
        synk.close()
