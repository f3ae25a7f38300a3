"""The package layout shows the architecture: dependencies point one way (instrumentation and the
adapters -> collector -> storage; the doctor reads storage; the read model reads storage and the
doctor; app and exporter read through them; the UI never imports the CLI). Read with ``ast`` from
the source, every import counted (top level, TYPE_CHECKING blocks, function bodies)."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable, Iterator
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
    "compare": {"adapters", "app", "cli", "collector", "doctor", "engine", "exporter", "inspector",
                "instrumentation"},
    # the engines observed: they offer the instrumentation's hooks, and know nothing that observes them
    "engine": {"adapters", "app", "cli", "collector", "compare", "doctor", "exporter", "inspector", "readmodel",
               "storage"},
    # what runs an engine observed: below the CLI, reading verdicts through the read model
    "adapters": {"app", "cli", "compare", "doctor", "exporter"},
    # re-scores stored runs with the target alone: reads and writes the store, judges with the audit's
    # per-token rule; verdicts are the doctor's
    "replay": {"adapters", "app", "cli", "collector", "compare", "doctor", "engine", "exporter", "inspector",
               "readmodel"},
    "cli": set(),  # the top floor
}


def _imports(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """``(file, dotted name)`` for every absolute import in ``paths``, anywhere in a file: ``import a.b``
    gives ``a.b``; ``from a.b import c`` gives ``a.b`` and ``a.b.c``."""
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from ((path, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                yield path, node.module or ""
                yield from ((path, f"{node.module}.{alias.name}") for alias in node.names)


def imported_packages(package: str) -> dict[str, set[str]]:
    """``specscope`` subpackage -> the files of ``package`` importing it."""
    found: dict[str, set[str]] = {}
    for path, name in _imports((ROOT / package).rglob("*.py")):
        parts = name.split(".")
        if parts[0] == "specscope" and len(parts) > 1 and (ROOT / parts[1]).is_dir():
            found.setdefault(parts[1], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    imports = imported_packages(package)
    wrong = {target: sorted(files) for target, files in imports.items() if target in FORBIDDEN[package]}
    assert not wrong, f"specscope.{package} imports {wrong}"


def test_every_package_has_its_floor():
    assert set(FORBIDDEN) == {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Every module under ``root`` (dotted, from its parent) -> the modules under ``root`` it imports,
    anywhere in its file: ``from a import b`` counts ``a.b`` where that is a module, else ``a``."""
    def name(path: Path) -> str:
        parts = path.relative_to(root.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(path): path for path in root.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                          for a in node.names}
        graph[module] = (found & files.keys()) - {module}
    return graph


def test_no_module_imports_itself_round_a_circle():
    graphlib.TopologicalSorter(import_graph(ROOT)).prepare()  # CycleError names the circle


def test_the_circle_check_sees_circles(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg import a\n")
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(import_graph(tmp_path / "pkg")).prepare()


MAX_MODULE_LINES = 400  # a module a newcomer reads in one sitting; past it, it holds more than one job


def _long_modules(root: Path) -> list[str]:
    """``path: n lines`` of every module under ``root`` longer than :data:`MAX_MODULE_LINES`."""
    lengths = {path: len(path.read_text().splitlines()) for path in sorted(root.rglob("*.py"))}
    return [f"{path.relative_to(root)}: {n} lines" for path, n in lengths.items() if n > MAX_MODULE_LINES]


def test_no_module_is_over_400_lines():
    assert _long_modules(ROOT) == []


def test_the_length_check_sees_long_modules(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert _long_modules(tmp_path) == [f"pkg/long.py: {MAX_MODULE_LINES + 1} lines"]


def _event_places(events, routes) -> tuple[set[str], set[str], set[str]]:
    """Names of the event types of ``events`` (a module): its ``EventBase`` dataclasses, those named
    in its ``Event`` union, and those with a route in ``routes``."""
    from typing import get_args

    classes = {v.__name__ for v in vars(events).values()
               if isinstance(v, type) and issubclass(v, events.EventBase) and v is not events.EventBase}
    return classes, {t.__name__ for t in get_args(events.Event)}, {t.__name__ for t in routes}


def test_an_event_type_lives_in_two_places():
    """docs/design.md, "Event model": an event type is its dataclass in events.py (an ``EventBase``
    named in the ``Event`` union, which the collector's boundary reads) and its route in
    ``storage/_rows.py``; everything else derives from those."""
    from specscope import events
    from specscope.storage._rows import ROUTES

    classes, union, routed = _event_places(events, ROUTES)
    assert classes == union == routed


def test_the_event_places_check_sees_a_missing_place():
    import types
    from dataclasses import dataclass

    from specscope import events

    @dataclass(frozen=True)
    class Extra(events.EventBase):
        run_id: str

    module = types.SimpleNamespace(EventBase=events.EventBase, Event=events.Event, Extra=Extra,
                                   RunStart=events.RunStart)
    classes, union, routed = _event_places(module, {events.RunStart: None})
    assert classes == {"Extra", "RunStart"} and "Extra" not in union and routed == {"RunStart"}


def test_the_prometheus_watch_writes_each_scrape_through_the_store():
    """One transaction per endpoint and scrape, with no collector between: the store's own write."""
    sources = [path.read_text() for path in (ROOT / "adapters").glob("*watch*.py")]
    calls = {node.func.attr for source in sources for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert not any("specscope.collector" in source for source in sources) and {"write", "touch"} <= calls


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


def _finding_tables() -> dict[str, set[str]]:
    """What only the findings module may hold, and the files holding it: ``severities`` (a dict literal
    mapping code-like names to severities) and ``renderers`` (text starting an indented ``evidence:``
    line)."""
    import re

    from specscope.events import SEVERITIES

    found: dict[str, set[str]] = {"severities": set(), "renderers": set()}
    for path in ROOT.rglob("*.py"):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Dict) and node.values
                    and all(isinstance(v, ast.Constant) and v.value in SEVERITIES for v in node.values)
                    and all(isinstance(k, ast.Constant) and str(k.value).isupper() for k in node.keys)):
                found["severities"].add(where)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.match(r"\s+evidence: ", node.value):
                found["renderers"].add(where)
    return found


def test_one_findings_module():
    """The doctor's and the inspector's codes, severities and text form are written once."""
    from specscope import doctor, findings, inspector

    assert _finding_tables() == {"severities": {"findings.py"}, "renderers": {"findings.py"}}
    assert set(doctor.CODES) | set(inspector.CODES) == set(findings.SEVERITY)
    assert set(doctor.CODES) & set(inspector.CODES) == {"CHECKS_SKIPPED"}


def test_the_findings_check_sees_tables(tmp_path, monkeypatch):
    (tmp_path / "doctor").mkdir()
    (tmp_path / "doctor" / "_codes.py").write_text('SEVERITY = {"AUX_NOT_FUSED": "error"}\n'
                                                    'LINE = f"        evidence: {1}"\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _finding_tables() == {"severities": {"doctor/_codes.py"}, "renderers": {"doctor/_codes.py"}}


def test_benchmarks_use_public_names_and_tests_no_benchmarks():
    """Benchmarks measure the public API (the write path's parts are exported by ``storage``); what
    a test shares with a benchmark lives in the package, not in ``benchmarks/``."""
    repo = ROOT.parent
    private = [(path.name, name) for path, name in _imports((repo / "benchmarks").glob("*.py"))
               if name.startswith("specscope.") and any(part.startswith("_") for part in name.split("."))]
    assert private == []
    assert [(path.name, name) for path, name in _imports((repo / "tests").glob("*.py"))
            if name.split(".")[0] == "benchmarks"] == []


def test_root_modules_are_the_base_layer():
    """Modules at the package root (events, errors, metrics, findings, ...) are what every package
    shares: they import no subpackage, so nothing that stands above the engine (the demo job) or
    reads the store lives there."""
    roots = [path for path in ROOT.glob("*.py") if path.name not in ("__init__.py", "__main__.py")]
    found = {(path.name, name) for path, name in _imports(roots)
             if name.startswith("specscope.") and (ROOT / name.split(".")[1]).is_dir()}
    assert found == set()


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
