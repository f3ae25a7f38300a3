"""The package layout shows the architecture: dependencies point one way (instrumentation and the
adapters -> collector -> storage; the doctor reads storage; the read model reads storage and the
doctor; app and exporter read through them; the UI never imports the CLI). Read with ``ast`` from
the source, every import counted (top level, TYPE_CHECKING blocks, function bodies)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specscope

ROOT = Path(specscope.__file__).parent

# package -> packages it must never import (directly, anywhere in its files)
FORBIDDEN = {
    "storage": {"instrumentation", "collector", "app", "doctor", "cli", "engine", "adapters", "exporter",
                "readmodel"},
    "collector": {"instrumentation", "app", "doctor", "cli", "engine", "adapters", "readmodel"},
    "instrumentation": {"app", "doctor", "cli", "engine", "adapters", "exporter", "inspector", "readmodel"},
    "doctor": {"app", "cli", "engine", "adapters", "instrumentation", "readmodel", "exporter"},
    "readmodel": {"app", "cli", "engine", "adapters", "instrumentation", "exporter", "collector"},
    "inspector": {"app", "cli", "engine", "adapters", "instrumentation", "doctor", "readmodel"},
    "app": {"cli", "engine", "adapters", "instrumentation"},
    "exporter": {"app", "cli", "engine", "adapters", "instrumentation", "collector"},
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


def test_the_prometheus_watch_is_a_producer_writing_through_the_collector():
    source = (ROOT / "adapters" / "prometheus_watch.py").read_text()
    calls = {node.func.attr for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "from specscope.collector import" in source and not calls & {"write", "touch", "replace_findings"}


def test_the_check_sees_imports():
    assert "storage" in imported_packages("collector")  # the real edge it must find


def _sql_outside_storage() -> list[str]:
    """``file:line`` of every string literal outside ``storage/`` that reads like SQL (``SELECT ...
    FROM``), and of every ``text(...)`` call (SQLAlchemy's raw-SQL constructor)."""
    import re

    statement = re.compile(r"\bSELECT\b.+\bFROM\b", re.DOTALL)
    found = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "storage":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            sql = isinstance(node, ast.Constant) and isinstance(node.value, str) and statement.search(node.value)
            call = (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) == "text")
            if sql or call:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_statement_lives_in_storage():
    """The app, the doctor, the exporter and the CLI run named queries of ``storage/queries.py``."""
    assert _sql_outside_storage() == []


def test_the_sql_check_sees_statements(tmp_path, monkeypatch):
    (tmp_path / "storage").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "page.py").write_text('import sqlalchemy as sa\nQ = sa.text("SELECT 1")\n'
                                              'R = """SELECT run_id\n  FROM runs"""\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _sql_outside_storage() == ["app/page.py:2", "app/page.py:3"]


# what only the read model may do: run the doctor for a run's verdict, define when a run is stale,
# lost or ended
VERDICT_NAMES = {"diagnose", "checkpoint_findings", "save_findings"}
STATE_NAMES = {"STALE_AFTER_S", "LOST_AFTER_S", "ENDED"}
READ_MODEL = {"readmodel/_run_view.py", "storage/views.py"}  # LOST_AFTER_S is the view's, in SQL


def _read_side_outside_the_read_model(root: Path) -> list[str]:
    """``file:line: what`` for each import of the doctor's verdict functions outside ``doctor/`` and
    ``readmodel/``, each definition of a state timeout or of the ended statuses, and each literal
    collection naming both 'finished' and 'crashed' (an ended-statuses tuple by another name), outside
    :data:`READ_MODEL`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root))
        if name in READ_MODEL:
            continue
        package = path.relative_to(root).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specscope.doctor")
                    and package not in ("doctor", "readmodel")):
                found += [f"{name}:{node.lineno}: imports {a.name}" for a in node.names if a.name in VERDICT_NAMES]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{name}:{node.lineno}: defines {t.id}" for t in targets
                          if isinstance(t, ast.Name) and t.id in STATE_NAMES]
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if {"finished", "crashed"} <= values:
                    found.append(f"{name}:{node.lineno}: ended statuses {sorted(values)}")
    return found


def test_the_read_side_lives_once():
    """The doctor CLI, the dashboard and the exporter get a run's state, verdict and counts from
    ``specscope.readmodel``; nobody else runs the doctor for them or decides when a run has ended."""
    assert _read_side_outside_the_read_model(ROOT) == []


def test_the_read_side_check_sees_duplicates(tmp_path):
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "x.py").write_text(
        "from specscope.doctor import diagnose, named_ranks\nSTALE_AFTER_S = 60.0\nDONE = ('finished', 'crashed')\n")
    assert _read_side_outside_the_read_model(tmp_path) == [
        "fleet/x.py:1: imports diagnose", "fleet/x.py:2: defines STALE_AFTER_S",
        "fleet/x.py:3: ended statuses ['crashed', 'finished']"]
