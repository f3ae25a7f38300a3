"""Store round trips, the acceptance views and the read-only query path, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from specscope import events as ev
from specscope.errors import ReadOnlyViolation, StoreError
from specscope.storage import Store, open_store
from specscope.storage.queries import RUNS

RUN = "run-1"


def _run_start(run_id: str = RUN, engine: str = "reference", ts: float = 100.0) -> ev.RunStart:
    config = ev.RunConfig(aux_layer_ids_resolved=(2, 15, 27), target_hidden_size=576,
                          expected_fused_width=1728, k=4, num_target_layers=30).to_dict()
    return ev.RunStart(run_id=run_id, engine=engine, engine_version="0.1", target_model="smollm2",
                       draft_model="eagle3", config=config, host="h1", ts_wall=ts)


def _verify_steps(run_id: str, request_id: str, accepted: list[int], k: int = 4,
                  t0: float = 101.0) -> list[ev.VerifyStep]:
    return [ev.VerifyStep(run_id=run_id, request_id=request_id, rank=0, step=i, proposed=k, accepted=a,
                          ts_wall=t0 + i) for i, a in enumerate(accepted)]


def _rows(store: Store, sql: str) -> list[tuple]:
    return store.query(sql)[1]


def _floats(rows: list[tuple]) -> list[tuple]:
    """PostgreSQL returns NUMERIC (Decimal) for the views' ratios, SQLite floats: compare as floats."""
    return [tuple(float(v) if v is not None and not isinstance(v, (str, int)) else v for v in row)
            for row in rows]


def test_round_trip_of_every_event_kind(store: Store) -> None:
    store.write([
        _run_start(),
        ev.RankStart(run_id=RUN, rank=0, world_size=1, host="h1", pid=42, device="cpu", ts_wall=100.0),
        ev.RequestStart(run_id=RUN, request_id="q1", rank=0, prompt_tokens=12, ts_wall=100.5),
        ev.VerifyStep(run_id=RUN, request_id="q1", rank=0, step=0, proposed=4, accepted=2,
                      draft_s=0.01, verify_s=0.02, emitted=("a", "b", "c"), ts_wall=101.0),
        ev.VerifyStep(run_id=RUN, request_id="q1", rank=0, step=1, proposed=4, accepted=2,
                      accepted_mask="1010", ts_wall=102.0),
        ev.TensorEvent(run_id=RUN, rank=0, hook_point="draft.forward:hidden_states", call_index=3,
                       shape=(1, 5, 576), dtype="float32", device="cpu", expected_shape=(1, -1, 1728),
                       absmax=3.5, mean=0.25, nonfinite=0, request_id="q1", step=1, ts_wall=101.5),
        ev.TensorEvent(run_id=RUN, rank=0, hook_point="draft.fc:scale", call_index=0, shape=(),
                       dtype="float32", device="cpu", ts_wall=101.6),
        ev.ProvenanceEvent(run_id=RUN, rank=0, call_index=3, configured=(2, 15, 27), received=(30, None),
                           width=576, ts_wall=101.7),
        ev.ProvenanceEvent(run_id=RUN, rank=0, call_index=4, configured=(2, 15, 27),
                           received=(2, 15, 27), width=1728, ts_wall=101.8),
        ev.LoadReport(run_id=RUN, rank=0, module="draft", source="/ckpt/model.safetensors", strict=False,
                      loaded=10, missing=("layers.0.mlp.up_proj.weight",), unexpected=("midlayer.x",),
                      renamed=(("midlayer.y", "layers.0.y"),), ts_wall=100.2),
        ev.Finding(code="AUX_NOT_FUSED", severity="error", message="draft input width 576 != 1728",
                   evidence={"observed_width": 576, "expected_width": 1728}, fix="enable aux capture",
                   run_id=RUN, ts_wall=103.0),
        ev.RequestEnd(run_id=RUN, request_id="q1", rank=0, output_tokens=5, verify_steps=2, text="hi",
                      ts_wall=103.5),
        ev.RankStatus(run_id=RUN, rank=0, hook_calls=40, hook_errors=1, graph_mode="mixed",
                      finished=True, ts_wall=104.0),
    ])

    run = _rows(store, "SELECT run_id, engine, engine_version, target_model, draft_model, fault, "
                       "world_size, host, started_wall, config FROM runs")
    assert run[0][:-1] == (RUN, "reference", "0.1", "smollm2", "eagle3", None, 1, "h1", 100.0)
    assert json.loads(run[0][-1])["aux_layer_ids_resolved"] == [2, 15, 27]
    assert _rows(store, "SELECT rank, world_size, host, pid, device, started_wall, ended_wall, "
                        "hook_calls, hook_errors, graph_mode FROM run_ranks") == [
        (0, 1, "h1", 42, "cpu", 100.0, 104.0, 40, 1, "mixed")]
    assert _rows(store, "SELECT request_id, rank, prompt_tokens, output_tokens, verify_steps, text, "
                        "started_wall, finished_wall FROM requests") == [
        ("q1", 0, 12, 5, 2, "hi", 100.5, 103.5)]
    steps = _rows(store, "SELECT step, proposed, accepted, accepted_mask, draft_s, verify_s, emitted, "
                         "ts_wall FROM verify_steps ORDER BY step")
    assert steps == [(0, 4, 2, "1100", 0.01, 0.02, '["a","b","c"]', 101.0),
                     (1, 4, 2, "1010", None, None, None, 102.0)]
    assert _rows(store, "SELECT hook_point, call_index, shape, width, dtype, device, expected_shape, "
                        "expected_width, absmax, mean, nonfinite, request_id, step, graph_phase "
                        "FROM tensor_events ORDER BY call_index DESC") == [
        ("draft.forward:hidden_states", 3, "1x5x576", 576, "float32", "cpu", "1x-1x1728", 1728,
         3.5, 0.25, 0, "q1", 1, "eager"),
        ("draft.fc:scale", 0, "", None, "float32", "cpu", None, None, None, None, None, None, None,
         "eager")]
    provenance = _rows(store, "SELECT call_index, configured, received, matches, width "
                              "FROM provenance ORDER BY call_index")
    assert [(c, json.loads(a), json.loads(b), bool(m), w) for c, a, b, m, w in provenance] == [
        (3, [2, 15, 27], [30, None], False, 576), (4, [2, 15, 27], [2, 15, 27], True, 1728)]
    report = _rows(store, "SELECT module, source, strict, loaded, missing, unexpected, renamed "
                          "FROM load_reports")[0]
    assert report[:2] == ("draft", "/ckpt/model.safetensors") and not report[2] and report[3] == 10
    assert [json.loads(v) for v in report[4:]] == [["layers.0.mlp.up_proj.weight"], ["midlayer.x"],
                                                   [["midlayer.y", "layers.0.y"]]]
    finding = _rows(store, "SELECT run_id, source, code, severity, message, evidence, fix, ts_wall "
                           "FROM findings")[0]
    assert finding[:5] == (RUN, "doctor", "AUX_NOT_FUSED", "error", "draft input width 576 != 1728")
    assert json.loads(finding[5]) == {"observed_width": 576, "expected_width": 1728}
    assert finding[6:] == ("enable aux capture", 103.0)


def test_views_give_the_design_figures(store: Store) -> None:
    """docs/design.md, "Acceptance figures" by hand: k=4, accepted 0,1,4,2 -> AL = 1 + 7/4, rate 7/16,
    p = [3/4, 2/4, 1/4, 1/4]."""
    store.write([_run_start(), _run_start("run-empty", ts=50.0),
                 ev.RequestStart(run_id=RUN, request_id="q1", rank=0, prompt_tokens=3, ts_wall=100.0),
                 *_verify_steps(RUN, "q1", [0, 1, 4, 2]),
                 ev.RequestEnd(run_id=RUN, request_id="q1", rank=0, output_tokens=11, verify_steps=4,
                               ts_wall=110.0)])

    run = _floats(_rows(store, "SELECT verify_steps, proposed, accepted, mean_acceptance_length, "
                               "acceptance_rate, emitted_tokens FROM v_run_acceptance"))
    assert run == [(4, 16, 7, 2.75, 7 / 16, 11)]
    assert _floats(_rows(store, "SELECT position, accepted_steps, verify_steps, acceptance "
                                "FROM v_position_acceptance ORDER BY position")) == [
        (0, 3, 4, 0.75), (1, 2, 4, 0.5), (2, 1, 4, 0.25), (3, 1, 4, 0.25)]
    assert _floats(_rows(store, "SELECT request_id, verify_steps, mean_acceptance_length, "
                                "acceptance_rate, duration_s FROM v_request_acceptance")) == [
        ("q1", 4, 2.75, 7 / 16, 10.0)]
    assert _floats(_rows(store, "SELECT request_id, position, accepted_steps, acceptance "
                                "FROM v_request_position_acceptance ORDER BY position")) == [
        ("q1", 0, 3, 0.75), ("q1", 1, 2, 0.5), ("q1", 2, 1, 0.25), ("q1", 3, 1, 0.25)]
    summaries = {row["run_id"]: row for row in store.fetch(RUNS)}
    assert summaries[RUN]["mean_acceptance_length"] == 2.75
    assert summaries[RUN]["acceptance_rate"] == 7 / 16
    # a run with no verify step: NULL figures, not an error
    empty = summaries["run-empty"]
    assert (empty["verify_steps"], empty["mean_acceptance_length"], empty["acceptance_rate"]) == (
        0, None, None)
    assert [row["run_id"] for row in store.fetch(RUNS)] == [RUN, "run-empty"]  # newest first


def test_first_run_start_wins_and_rank_rows_merge(store: Store) -> None:
    store.write([_run_start(engine="first"), _run_start(engine="second")])
    store.write([_run_start(engine="third")])
    assert _rows(store, "SELECT engine FROM runs") == [("first",)]

    # status and counters before the RankStart: a placeholder row the RankStart then fills in
    store.write([ev.RankStatus(run_id=RUN, rank=1, hook_calls=5, hook_errors=0, ts_wall=101.0)],
                counters={(RUN, 1): (1, 2)})
    store.write((), counters={(RUN, 1): (3, 4)})
    store.write([ev.RankStart(run_id=RUN, rank=1, world_size=2, host="h2", pid=7, device="cuda:1",
                              ts_wall=100.0),
                 ev.RankStatus(run_id=RUN, rank=1, hook_calls=9, hook_errors=2, finished=True,
                               ts_wall=102.0)])
    store.write([ev.RankStatus(run_id=RUN, rank=1, hook_calls=10, hook_errors=2, ts_wall=103.0)])
    assert _rows(store, "SELECT world_size, host, pid, device, events_written, events_dropped, "
                        "hook_calls, hook_errors, ended_wall FROM run_ranks") == [
        (2, "h2", 7, "cuda:1", 4, 6, 10, 2, 102.0)]


def test_a_failing_batch_writes_nothing(store: Store) -> None:
    bad = ev.RankStart(run_id=RUN, rank=0, world_size=1, host=None, pid=1, device="cpu")  # NOT NULL column
    with pytest.raises(StoreError, match="writing to"):
        store.write([_run_start(), *_verify_steps(RUN, "q1", [1, 2]), bad], counters={(RUN, 0): (4, 0)})
    assert _rows(store, "SELECT COUNT(*) FROM runs") == [(0,)]
    assert _rows(store, "SELECT COUNT(*) FROM verify_steps") == [(0,)]
    assert _rows(store, "SELECT COUNT(*) FROM run_ranks") == [(0,)]


def test_non_event_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="not a specscope event"):
        store.write([object()])


WRITES = [
    "INSERT INTO runs (run_id, engine, engine_version, target_model, draft_model, config, world_size, "
    "host, started_wall) VALUES ('x', 'e', 'v', 't', 'd', '{}', 1, 'h', 1.0)",
    "UPDATE runs SET engine = 'changed'",
    "DELETE FROM verify_steps",
    "DROP TABLE verify_steps",
    "CREATE TABLE intruder (a INTEGER)",
    "DROP VIEW v_run_summary",
]


@pytest.mark.parametrize("sql", WRITES)
def test_query_refuses_writes_and_changes_nothing(store: Store, sql: str) -> None:
    store.write([_run_start(), *_verify_steps(RUN, "q1", [1, 2, 3])])
    before = store.fetch(RUNS)
    with pytest.raises(ReadOnlyViolation):
        store.query(sql)
    assert store.fetch(RUNS) == before
    assert _rows(store, "SELECT COUNT(*) FROM verify_steps") == [(3,)]
    with store.connect() as conn:
        assert "intruder" not in sa.inspect(conn).get_table_names()


def test_query_refuses_a_second_statement(store: Store) -> None:
    store.write([_run_start()])
    with pytest.raises(StoreError):
        store.query("COMMIT; DELETE FROM runs")
    with pytest.raises(StoreError):
        store.query("SELECT 1; DELETE FROM runs")
    assert _rows(store, "SELECT COUNT(*) FROM runs") == [(1,)]


def test_query_params_limit_and_errors(store: Store) -> None:
    store.write([_run_start(), *_verify_steps(RUN, "q1", [0, 1, 2, 3, 4])])
    columns, rows = store.query("SELECT step, accepted FROM verify_steps WHERE accepted >= :low "
                                "ORDER BY step", {"low": 2}, limit=2)
    assert columns == ["step", "accepted"] and rows == [(2, 2), (3, 3)]
    assert store.query("SELECT 'a%b' AS text") == (["text"], [("a%b",)])
    with pytest.raises(StoreError, match="no_such_table"):
        store.query("SELECT * FROM no_such_table")
    with pytest.raises(StoreError):
        store.query("SELEC 1")


def test_connect_is_read_only(store: Store) -> None:
    store.write([_run_start()])
    with pytest.raises(ReadOnlyViolation), store.connect() as conn:
        conn.execute(sa.text("DELETE FROM runs"))
    assert _rows(store, "SELECT COUNT(*) FROM runs") == [(1,)]


def test_read_only_store_refuses_writes(store_url: str) -> None:
    open_store(store_url).close()
    with open_store(store_url, read_only=True) as store:
        assert store.read_only
        with pytest.raises(ReadOnlyViolation, match="read-only"):
            store.write([_run_start()])
        assert store.fetch(RUNS) == []


def test_unreachable_postgres_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="opening"):
        open_store("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://u@h/db",
                                 "postgresql+psycopg2://u@h/db", "::not a url::/x://"])
def test_unsupported_locations_are_store_errors(url: str) -> None:
    with pytest.raises(StoreError):
        open_store(url)


@pytest.mark.parametrize("view, where", [
    ("v_run_acceptance", "run_id = 'r'"), ("v_rank_acceptance", "run_id = 'r'"),
    ("v_run_summary", "run_id = 'r'"), ("v_request_acceptance", "run_id = 'r'"),
    ("v_position_acceptance", "run_id = 'r'"),
    ("v_request_position_acceptance", "run_id = 'r' AND request_id = 'q'"), ("v_tensor_contract", "run_id = 'r'"),
    ("v_sampling_acceptance", "run_id = 'r'"),
])
def test_a_run_filter_reaches_an_index(tmp_path, view: str, where: str) -> None:
    """SQLite's plan for a filtered view reads verify_steps and the summary tables through an index
    range (SEARCH), never a whole-table or whole-index SCAN: one run's figures cost that run's rows on
    a store of any size."""
    open_store(str(tmp_path / "plan.db")).close()
    with sa.create_engine(f"sqlite:///{tmp_path / 'plan.db'}").connect() as conn:
        plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN SELECT * FROM {view} WHERE {where}")]
    tables = (" verify_steps", " acceptance_masks", " request_accepts", " tensor_shapes")
    on_steps = [step for step in plan if any(table in step for table in tables)
                or step.startswith(("SCAN v ", "SEARCH v ", "SCAN g", "SEARCH g", "SCAN m ", "SEARCH m ",
                                    "SCAN a ", "SEARCH a "))]
    assert on_steps and all(step.startswith("SEARCH") for step in on_steps), plan


def test_statement_tracer_sees_every_statement_with_its_time(store_url, tmp_path):
    """``open_store(tracer=)``: reads and writes are reported with their SQL and seconds."""
    from specscope.events import RunStart

    seen = []
    with open_store(store_url, tracer=lambda sql, params, seconds: seen.append((sql, seconds))) as store:
        store.write([RunStart(run_id="traced", engine="e", engine_version="0", target_model="t",
                              draft_model="d", config={})])
        store.query("SELECT run_id FROM runs")
    if not store_url.startswith("postgresql"):  # PostgreSQL writes go through COPY, not statements
        assert any("INSERT" in sql.upper() and "runs" in sql for sql, _ in seen)
    assert any(sql.startswith("SELECT run_id FROM runs") for sql, _ in seen), [s[:60] for s, _ in seen[-6:]]
    assert all(seconds >= 0 for _, seconds in seen)
