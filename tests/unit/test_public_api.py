"""The names the package exports resolve, including those imported on first use."""

import merlin_torch_serving


def test_every_exported_name_resolves():
    missing = [
        name for name in merlin_torch_serving.__all__ if not hasattr(merlin_torch_serving, name)
    ]
    assert missing == []
