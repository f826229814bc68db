"""Every function test of the CPU suite on one GPU rank, twice: outputs copied to
the host as one rank does (``GpuDevice.to_host``), and through the NCCL reduction
that several GPUs use, forced on one rank (a communicator of one), with weighted
and unweighted averages.  So a machine with a single GPU checks the GPU paths
that do not need a second process."""

import numpy as np
import pytest
import test_function
from test_function import *  # noqa: F401,F403  (the tests themselves)
from test_function import make_env

import synkhronos as synk
from synkhronos._devices import gpu

pytestmark = pytest.mark.gpus(1)


@pytest.fixture(scope="module", params=["host", "nccl"])
def env(request):
    saved = gpu.GpuDevice.reduces_outputs, test_function.ATOL
    if request.param == "nccl":
        gpu.GpuDevice.reduces_outputs = property(lambda self: True)
    # XLA sums in another order than PyTensor's CPU linker: outputs that cancel to
    # about 1e-2 from terms about 3 then differ by ~2e-7 (seen: 1.8e-7, relative
    # 1.4e-5).  (The two-rank GPU suite has passed with 1e-8.)
    test_function.ATOL = 1e-6
    try:
        yield make_env(1, use_gpu=True)
        synk.close()
    finally:
        gpu.GpuDevice.reduces_outputs, test_function.ATOL = saved


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8", "bool", "bfloat16"])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
def test_host_copies_equal_jax_own(env, dtype, shape):
    import jax.numpy as jnp

    device = synk._session.runtime.current().device
    base = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape) - 2.5
    value = jnp.asarray(base).astype(dtype)
    transposed = value.T
    got = device.to_host([value, transposed, base])
    for g, want in zip(got, [np.asarray(value), np.asarray(transposed), base]):
        assert isinstance(g, np.ndarray) and g.dtype == want.dtype and g.shape == want.shape
        np.testing.assert_array_equal(g, want)
