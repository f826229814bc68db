"""Every Synkhronos function's mode includes Synkhronos's own rewrites
(``_graph.linking.device_kwargs``): a maximum's gradient from its operands, and
elementwise work kept at its operands' axes."""

import pytest

from synkhronos._graph import expand_dims, max_gradient
from synkhronos._graph.linking import device_kwargs


class _Device:
    precision = "highest"

    def function_kwargs(self, kwargs):
        return dict(kwargs)


@pytest.mark.parametrize("tag", [max_gradient.TAG, expand_dims.TAG])
def test_synkhronos_functions_include_it(tag):
    mode = device_kwargs(_Device(), {})["mode"]
    assert tag in mode.provided_optimizer.include
