"""The documentation's examples on GPU ranks: ``synk.fork(2)`` picks the GPUs when there
are any, so the same files run unchanged and check the same results."""

import pytest
from test_docs import EXAMPLES, README_EXAMPLE_ID, run_example


@pytest.mark.parametrize("example", EXAMPLES + [README_EXAMPLE_ID],
                         ids=[p.stem for p in EXAMPLES] + [README_EXAMPLE_ID])
def test_example_on_gpu_ranks(example, tmp_path):
    proc = run_example(example, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All assertions passed." in proc.stdout, proc.stdout + proc.stderr
    assert "detected GPUs" in proc.stderr + proc.stdout, "did not run on GPU ranks: " + proc.stderr
