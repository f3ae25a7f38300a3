"""specscope.instrumentation's shape: no import cycle, one spelling per operation, sampling=, point names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from _draft_fixture import AUX, HIDDEN, ListSink, make_models, run_config, run_engine

import specscope.instrumentation as instrumentation
from specscope import points
from specscope.errors import ConfigError
from specscope.events import TensorEvent
from specscope.instrumentation import SamplingConfig, Tracer, instrument

PACKAGE = "specscope.instrumentation"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in the file: top level, TYPE_CHECKING
    blocks and function bodies alike), read with ``ast`` from the package's source files."""
    root = Path(instrumentation.__file__).parent
    modules = {path.stem if path.stem != "__init__" else "": path for path in root.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import inside the package
                    base = f"{PACKAGE}.{base}" if base else PACKAGE
                # ``from package import module`` depends on that module, ``from module import x``
                # on the module.
                targets = [f"{base}.{alias.name}" if base == PACKAGE and alias.name in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    module = target[len(PACKAGE) + 1:].split(".")[0]
                    if module in modules and module != name:
                        edges.add(module)
        graph[name] = edges
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of module names, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_import_graph_reader_sees_edges_and_finds_a_planted_cycle():
    graph = import_graph()
    assert {"tracer", "_hooks"} <= graph["_instrument"]  # the reader sees real edges
    assert "_state" in graph["_hooks"] and "_state" in graph["tracer"]
    assert cycle({**graph, "_state": graph["_state"] | {"tracer"}}) is not None


def test_instrumentation_has_no_import_cycle():
    graph = import_graph()
    assert cycle(graph) is None, " -> ".join(cycle(graph))
    # The package __init__ is imported by nobody inside it: importing a submodule needs no circle.
    assert not [name for name, edges in graph.items() if "" in edges]


def test_one_public_spelling_per_operation():
    assert not hasattr(Tracer, "instrument") and not hasattr(Tracer, "check_load")
    assert callable(instrumentation.instrument) and callable(instrumentation.check_load)


def test_tracer_takes_a_sampling_config():
    _, draft = make_models()
    sink = ListSink()
    sampling = SamplingConfig(first_calls=2, sample_every=3)
    args = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, HIDDEN))
    with Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                config=run_config(), sampling=sampling) as tracer, torch.no_grad():
        assert tracer.sampling is sampling
        instrument(tracer, draft=draft)
        for _ in range(10):
            draft(*args)
    calls = [e.call_index for e in sink.of(TensorEvent) if e.hook_point == points.draft_input("input_ids")]
    assert calls == [0, 1, 3, 6, 9]  # the first 2 calls, then every 3rd (one signature throughout)


def test_sampling_config_and_sampling_keywords_are_exclusive():
    with pytest.raises(ConfigError, match="sample_every"):
        Tracer(ListSink(), engine="e", engine_version="0", target_model="t", draft_model="d",
               config=run_config(), sampling=SamplingConfig(), sample_every=4)


def test_hook_point_names_round_trip():
    assert points.draft_input("hidden_states") == points.DRAFT_HIDDEN_STATES == "draft.forward:hidden_states"
    assert points.target_layer_input(15) == "target.layers.15:input"
    assert points.capture_layer(points.target_layer_input(15)) == 15
    assert points.capture_layer("target.layers.x:input") is None
    assert points.capture_layer("draft.fc:input") is None
    assert points.point("draft.fc", points.OUTPUT) == "draft.fc:output"
    assert points.item(points.OUTPUT, 1) == "output.1"


def test_recorded_points_are_the_names_of_the_points_module():
    target, draft = make_models()
    sink = ListSink()
    with Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                config=run_config(), first_calls=1000) as tracer:
        instrument(tracer, draft=draft, target=target)
        run_engine(target, draft, tracer, requests=1, steps=1)
    recorded = {e.hook_point for e in sink.of(TensorEvent)}
    assert {points.target_layer_input(i) for i in AUX} | {
        points.DRAFT_HIDDEN_STATES, points.draft_input("input_ids"),
        points.point(points.DRAFT_FORWARD, points.item(points.OUTPUT, 0))} <= recorded
    assert {points.capture_layer(p) for p in recorded} - {None} == set(AUX)
