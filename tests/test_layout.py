"""The package layout shows the architecture: dependencies point one way (instrumentation -> collector
-> storage; app / doctor / fleet read storage; the UI never imports the CLI). Read with ``ast`` from the
source, every import counted (top level, TYPE_CHECKING blocks, function bodies)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specscope

ROOT = Path(specscope.__file__).parent

# package -> packages it must never import (directly, anywhere in its files)
FORBIDDEN = {
    "storage": {"instrumentation", "collector", "app", "doctor", "cli", "engine", "adapters", "fleet"},
    "collector": {"instrumentation", "app", "doctor", "cli", "engine", "adapters"},
    "instrumentation": {"app", "doctor", "cli", "engine", "adapters", "fleet", "inspector"},
    "doctor": {"app", "cli", "engine", "adapters", "instrumentation"},
    "inspector": {"app", "cli", "engine", "adapters", "instrumentation", "doctor"},
    "app": {"cli", "engine", "adapters", "instrumentation"},
    "fleet": {"app", "cli", "engine", "adapters", "instrumentation"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    """``specscope`` subpackage -> the files of ``package`` importing it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "specscope" and len(parts) > 1:
                    found.setdefault(parts[1], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    imports = imported_packages(package)
    wrong = {target: sorted(files) for target, files in imports.items() if target in FORBIDDEN[package]}
    assert not wrong, f"specscope.{package} imports {wrong}"


def test_the_check_sees_imports():
    assert "storage" in imported_packages("collector")  # the real edge it must find
