"""The public surface: every exported name resolves, and each subpackage's ``__all__`` is complete."""

from __future__ import annotations

import importlib

import pytest

import specscope

PACKAGES = ["specscope.instrumentation", "specscope.collector", "specscope.storage", "specscope.doctor",
            "specscope.readmodel", "specscope.exporter",
            "specscope.inspector", "specscope.engine", "specscope.replay"]


def test_top_level_names_resolve():
    for name in specscope.__all__:
        assert getattr(specscope, name) is not None, name
    with pytest.raises(AttributeError):
        specscope.not_a_name  # noqa: B018


@pytest.mark.parametrize("package", PACKAGES)
def test_subpackage_all_is_complete(package):
    module = importlib.import_module(package)
    public = {n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", "")
              .startswith("specscope") and not isinstance(v, type(importlib))}
    assert public <= set(module.__all__), f"{package} exports undeclared names: {public - set(module.__all__)}"
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names missing {name}"
