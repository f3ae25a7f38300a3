"""Graph mode is aggregated per rank: a run whose ranks saw different modes is 'mixed' (not the
lexical MAX 'eager'), the Tensors page names each rank's mode, the doctor names the blind rank."""

from __future__ import annotations

import pytest
from _dashboard_traces import trace, write_store
from streamlit.testing.v1 import AppTest

from specscope import events as ev
from specscope.app import DB_ENV, ENTRY, queries
from specscope.doctor import diagnose
from specscope.storage import open_store


@pytest.fixture
def split_modes(tmp_path) -> str:
    path = write_store(tmp_path / "store.db", [trace("split-run", world_size=2)])
    with open_store(path) as store:  # rank 0 eager, rank 1 only saw CUDA-graph capture
        store.write([ev.RankStatus(run_id="split-run", rank=0, hook_calls=10, hook_errors=0,
                                   graph_mode="eager", finished=True),
                     ev.RankStatus(run_id="split-run", rank=1, hook_calls=10, hook_errors=0,
                                   graph_mode="capture_only", finished=True)])
    return path


def test_run_is_mixed_and_ranks_keep_their_mode(split_modes: str) -> None:
    with open_store(split_modes, read_only=True) as store:
        assert queries.run_summary(store, "split-run")["graph_mode"] == "mixed"
        # the SQL view says the same (v7; a lexical MAX before it read 'eager')
        assert store.query("SELECT graph_mode FROM v_run_summary WHERE run_id = 'split-run'")[1] == [("mixed",)]
        assert [(r["rank"], r["graph_mode"]) for r in queries.ranks(store, "split-run")] == [
            (0, "eager"), (1, "capture_only")]
        (blind,) = [f for f in diagnose(store, "split-run").findings if f.code == "GRAPH_MODE_BLIND"]
        assert blind.evidence["ranks"] == [1]


def _observed_mode(monkeypatch, db: str) -> str:
    """The Tensors page's "Observed mode" line for the store's newest run."""
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    at.switch_page("screens/tensors.py").run()
    assert not at.exception
    (mode,) = [i.value for i in at.info if i.value.startswith("Observed mode")]
    return mode


def test_tensors_page_shows_mode_per_rank(monkeypatch, split_modes: str) -> None:
    mode = _observed_mode(monkeypatch, split_modes)
    assert "**Mixed**" in mode and "Per rank: rank 0 eager, rank 1 capture_only." in mode


def test_tensors_page_says_what_a_cuda_graph_replay_run_observed(monkeypatch, tmp_path) -> None:
    path = write_store(tmp_path / "store.db", [trace("replayed")])
    with open_store(path) as store:
        store.write([ev.RankStatus(run_id="replayed", rank=0, hook_calls=10, hook_errors=0,
                                   graph_mode="cuda_graph", finished=True)])
    mode = _observed_mode(monkeypatch, path)
    assert "**CUDA-graph replay**" in mode and "static device buffer" in mode
