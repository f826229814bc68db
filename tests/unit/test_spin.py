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
