"""Every dashboard page under streamlit.testing.v1.AppTest, on an empty store, the synthetic healthy +
faulty store, a running run, a file that is not a store and a store of a newer schema."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from _dashboard_traces import trace, write_store
from streamlit.testing.v1 import AppTest

from specscope.app import DB_ENV, ENTRY
from specscope.app.snippet import SNIPPET
from specscope.storage import open_store, schema
from specscope.storage.queries import RUNS

PAGES = ("overview", "requests", "gpus", "tensors", "findings", "sql")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dash") / "store.db"
    return write_store(path, [trace("healthy-run", world_size=2),
                              trace("faulty-run", fault="no-aux-capture", t0=1_750_000_100.0)])


def app(monkeypatch, db: str) -> AppTest:
    monkeypatch.setenv(DB_ENV, db)
    return AppTest.from_file(str(ENTRY), default_timeout=60).run()


def texts(at: AppTest, kind: str) -> list[str]:
    return [element.value for element in getattr(at, kind)]


def visit(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"screens/{page}.py").run()
    assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
    return at


def test_no_old_style_pages_folder():
    """A ``pages/`` folder beside the entry script makes Streamlit's first script run an old-style
    multipage app whose raw page list (``main``, ``get started``, ...) flashes before st.navigation
    takes over: the page scripts live elsewhere."""
    assert not (ENTRY.parent / "pages").exists() and (ENTRY.parent / "screens" / "overview.py").exists()


def test_opens_on_latest_run_with_its_error_banner(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    assert not at.exception
    assert at.session_state["run_id"] == "faulty-run"
    faulty, healthy = at.selectbox(key="run_picker").options  # runs with error findings are marked
    assert faulty.startswith("[3 errors] ") and "no-aux-capture" in faulty and "[" not in healthy
    # the first line names every run with its verdict in colour, the open one marked
    (strip,) = [m.value for m in at.markdown if m.value.startswith("Runs: ")]
    assert "▶ :red[**3 errors**] specscope-reference no-aux-capture `faulty-r`" in strip
    assert ":green[**no finding**] specscope-reference `healthy-`" in strip
    errors = texts(at, "error")
    assert errors[0].startswith("**AUX_NOT_FUSED**") and "1728" in errors[0]
    assert [m.label for m in at.metric] == ["Accept length", "Accept rate", "Tokens/s",
                                            "Verify steps", "Requests", "Dropped"]
    assert at.metric[0].value == "1.00" and at.metric[3].value == "72"


def test_healthy_run_has_no_error_banner_on_any_page(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    at.selectbox(key="run_picker").set_value("healthy-run").run()
    assert not any("AUX_NOT_FUSED" in e for e in texts(at, "error"))
    assert any("No error or warning findings" in s for s in texts(at, "success"))
    assert float(at.metric[0].value) > 2.5
    for page in PAGES[1:]:
        visit(at, page)
        assert at.session_state["run_id"] == "healthy-run"
        assert not texts(at, "error"), page


def test_overview_marks_the_open_run(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    runs = at.dataframe[-1].value
    assert list(runs.columns[:3]) == ["open", "run", "started"]  # the key columns first
    assert runs.loc[runs["open"] == "▶", "run"].tolist() == ["faulty-r"]
    at.selectbox(key="run_picker").set_value("healthy-run").run()
    runs = at.dataframe[-1].value
    assert runs.loc[runs["open"] == "▶", "run"].tolist() == ["healthy-"]


def test_compare_side_by_side(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    at.selectbox(key="compare").set_value("healthy-run").run()
    assert not at.exception
    assert len(at.metric) == 12
    assert [m.value for m in at.metric if m.label == "Accept length"][0] == "1.00"
    assert any("No error or warning findings" in s for s in texts(at, "success"))


def test_requests_page_splits_acceptance_by_sampling_and_shows_the_text(monkeypatch, tmp_path):
    db = write_store(tmp_path / "mixed.db", [trace("mixed-run", temperatures=(0.0, 0.8))])
    at = visit(app(monkeypatch, db), "requests")
    assert "Acceptance by sampling" in [h.value for h in at.subheader]
    groups = at.dataframe[0].value.to_dict("records")
    assert [g["sampling"] for g in groups] == ["T=0.8", "greedy"] and [g["requests"] for g in groups] == [3, 3]
    assert set(at.dataframe[1].value["sampling"]) == {"greedy", "T=0.8"}
    shown = [e.label for e in at.expander]
    assert any(label.startswith("As returned") for label in shown)


def test_faulty_run_pages(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    visit(at, "requests")
    assert at.dataframe and at.selectbox(key="request").value == "req-0"
    marked = at.get("html")[0].proto.body  # the generated text: the faulty run accepts nothing
    assert "accepted draft token" in marked and 'title="step 0: target"' in marked
    assert 'title="step 0: draft"' not in marked
    visit(at, "gpus")
    assert at.dataframe
    visit(at, "tensors")
    assert texts(at, "error")[0].startswith("**AUX_NOT_FUSED** — ")  # the doctor's finding, its message
    assert "576 wide" in texts(at, "error")[0] and "1728" in texts(at, "error")[0]
    assert any("Eager" in i for i in texts(at, "info"))
    hook_points = list(dict.fromkeys(at.dataframe[-1].value["hook point"]))
    layers = [p for p in hook_points if p.startswith("target.layers.")]
    assert layers == ["target.layers.2:input", "target.layers.15:input", "target.layers.27:input"]
    declared = {row["field"]: row["value"] for row in at.dataframe[-2].value.to_dict("records")}
    assert declared["expected_fused_width"] == "1728" and set(declared) >= {"topk", "dtype", "num_draft_tokens"}
    visit(at, "findings")
    labels = [e.label for e in at.expander]
    assert any("AUX_NOT_FUSED" in label for label in labels) and any("CKPT_FORMAT" in label for label in labels)
    visit(at, "sql")
    assert at.dataframe and at.get("download_button")


def test_gpus_page_names_the_findings_of_each_rank(monkeypatch, demo_store):
    """The real two-rank demo run, rank 1 without aux capture: rank 1's row carries the doctor's
    findings that name it (AUX_NOT_FUSED among them), rank 0's row none."""
    from specscope.doctor import diagnose

    with open_store(demo_store, create=False, read_only=True) as store:
        ranked = max(store.fetch(RUNS), key=lambda r: r["started_wall"])["run_id"]
        fused = [f for f in diagnose(store, ranked).findings if f.code == "AUX_NOT_FUSED"]
    assert [f.evidence["ranks"] for f in fused] == [[1]]
    at = app(monkeypatch, demo_store)
    at.selectbox(key="run_picker").set_value(ranked).run()
    visit(at, "gpus")
    named = {row["rank"]: row["findings"] for row in at.dataframe[0].value.to_dict("records")}
    assert named[0] == "" and "AUX_NOT_FUSED" in named[1].split(", "), named


def test_sql_page_refuses_writes(monkeypatch, two_runs):
    at = visit(app(monkeypatch, two_runs), "sql")
    at.text_area[0].set_value("DELETE FROM runs")
    at.button[0].click().run()
    assert any("read-only" in e or "readonly" in e.lower() for e in texts(at, "error"))
    with open_store(two_runs, create=False, read_only=True) as store:
        assert len(store.fetch(RUNS)) == 2


def test_sql_page_keeps_columns_of_one_name(monkeypatch, two_runs):
    """Both columns named ``a`` are shown (the table kept the second only), as ``--json`` names them."""
    at = visit(app(monkeypatch, two_runs), "sql")
    at.text_area[0].set_value("SELECT 1 AS a, 2 AS a")
    at.button[0].click().run()
    assert not at.exception
    (table,) = at.dataframe
    assert list(table.value.columns) == ["a", "a_2"] and table.value.iloc[0].tolist() == [1, 2]


def test_empty_store_explains_instrumentation(monkeypatch, tmp_path):
    open_store(str(tmp_path / "empty.db")).close()
    at = app(monkeypatch, str(tmp_path / "empty.db"))
    assert not at.exception
    assert texts(at, "title") == ["No run recorded yet"]
    assert [c.value for c in at.code] == [SNIPPET.strip()]


def test_running_run_is_live_and_stale_run_says_so(monkeypatch, tmp_path):
    now = time.time()
    db = write_store(tmp_path / "live.db", [trace("stale-run", finished=False, t0=now - 3600),
                                            trace("live-run", finished=False, t0=now - 1, dt=0.001)])
    at = app(monkeypatch, db)
    assert not at.exception
    assert ":green-badge[live]" in [m.value for m in at.markdown]
    labels = at.selectbox(key="run_picker").options
    assert "live" in labels[0] and "stale" in labels[1]


def test_not_a_store_and_newer_schema_are_one_message(monkeypatch, tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    at = app(monkeypatch, str(text))
    assert not at.exception and len(at.error) == 1 and "Cannot open the store" in at.error[0].value
    db = tmp_path / "future.db"
    open_store(str(db)).close()
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO schema_migrations VALUES (99, 'from_the_future', 0)")
    engine.dispose()
    at = app(monkeypatch, str(db))
    assert not at.exception and "newer" in at.error[0].value


def test_snippet_is_the_readme_one_and_runs_against_real_modules(tmp_path, monkeypatch):
    """The README / empty-store snippet, executed as written around a real chain-drafting loop on a
    random HF Llama target and an EAGLE-3-shaped draft: the hooks see the draft input, the doctor
    has evidence (no NOT_OBSERVED), the serving-loop calls take the values the snippet names."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from _draft_fixture import AUX, K, make_models, run_engine

    from specscope.doctor import diagnose

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"```python\n{SNIPPET}```" in readme
    target_model, draft_model = make_models()
    checkpoint = str(tmp_path / "draft.safetensors")
    safetensors_torch.save_file({k: v.contiguous() for k, v in draft_model.state_dict().items()}, checkpoint)
    monkeypatch.chdir(tmp_path)
    cut = SNIPPET.index("# In the serving loop")
    names = {"target_model": target_model, "draft_model": draft_model, "aux_ids": AUX, "k": K,
             "checkpoint": checkpoint, "prompt_len": 6, "accepted": 2, "step_texts": ["a", "b", "c"],
             "output_len": 3, "text": "abc"}
    exec(SNIPPET[:cut], names)
    # real forwards on req-1 and req-2: a request id names one request of a run (a step stored again is a duplicate)
    run_engine(target_model, draft_model, names["tracer"], requests=2, steps=8, first_request=1)
    exec(SNIPPET[cut:], names)  # req-0: one step, then close
    with open_store(str(tmp_path / "specscope.db"), create=False, read_only=True) as store:
        runs = store.fetch(RUNS)
        assert [(r["engine"], r["verify_steps"], r["status"]) for r in runs] == [("my-engine", 17, "finished")]
        loads = store.query("SELECT loaded, missing FROM load_reports")[1]
        assert loads and loads[0][0] > 0 and json.loads(loads[0][1]) == []
        emitted = store.query("SELECT emitted FROM verify_steps WHERE emitted IS NOT NULL")[1]
        assert [json.loads(row[0]) for row in emitted] == [["a", "b", "c"]]
        report = diagnose(store)
    # A random draft accepts little, so acceptance codes may fire; the contract must be observed and kept.
    assert [c for c in report.codes()
            if c.startswith("AUX_") or c in ("NOT_OBSERVED", "WEIGHTS_DROPPED", "HOOK_ERRORS")] == []

# -- the dashboard says what the doctor says ---------------------------------------------------------

AGREEMENT_TRACES = ("healthy", "no_aux_capture", "off_by_one", "dropped_keys", "two_ranks_diverging",
                    "not_instrumented", "draft_only", "partial_capture")


def _convention_finding(run_id: str):
    from specscope.events import Finding

    return Finding("AUX_LAYER_IDS_CONVENTION", "warning", "explicit aux layer ids [2, 15, 27] mean "
                   "different target layers per engine", {"configured": [2, 15, 27]}, "Confirm the ids.",
                   run_id=run_id, source="inspect")


@pytest.fixture(scope="module")
def doctor_store(tmp_path_factory) -> str:
    """One run per doctor scenario of tests/_traces.py, each with the stored checkpoint warning
    AUX_LAYER_IDS_CONVENTION, and the doctor's findings saved (as `specscope demo` does)."""
    import _traces as T

    from specscope.doctor import diagnose, save_findings

    path = str(tmp_path_factory.mktemp("agree") / "store.db")
    with open_store(path) as store:
        for name in AGREEMENT_TRACES:
            trace = getattr(T, name)()
            trace.write(store)
            store.write([_convention_finding(trace.run_id)])
            save_findings(store, diagnose(store, trace.run_id))
    return path


def _codes(messages: list[str]) -> list[str]:
    return [m.split("**")[1] for m in messages if m.startswith("**")]


@pytest.mark.parametrize("name", AGREEMENT_TRACES)
def test_pages_show_the_doctors_findings(monkeypatch, doctor_store, name):
    import _traces as T

    from specscope.doctor import CONTRACT_CODES
    from specscope.readmodel import report

    run_id = getattr(T, name)().run_id
    with open_store(doctor_store, create=False, read_only=True) as store:
        verdict = report(store, run_id).findings  # what `specscope doctor --run` prints, in its order
    loud = [f for f in verdict if f.severity in ("error", "warning")]
    errors = [f.code for f in loud if f.severity == "error"]
    warnings = [f.code for f in loud if f.severity == "warning"]

    at = app(monkeypatch, doctor_store)
    at.selectbox(key="run_picker").set_value(run_id).run()
    assert _codes(texts(at, "error")) == errors and _codes(texts(at, "warning")) == warnings
    assert not loud or not texts(at, "success")  # green only when the doctor has nothing to say
    label = at.selectbox(key="run_picker").format_func(run_id)
    for severity, codes in (("error", errors), ("warning", warnings)):
        assert (f"{len(codes)} {severity}" in label) == bool(codes), label
    with open_store(doctor_store, create=False, read_only=True) as store:  # the other runs: stored counts
        for other in AGREEMENT_TRACES:
            other_id = getattr(T, other)().run_id
            other_found = report(store, other_id).findings
            counted = at.selectbox(key="run_picker").format_func(other_id)
            for severity in ("error", "warning"):
                n = sum(f.severity == severity for f in other_found)
                assert (f"{n} {severity}" in counted) == bool(n), (other, counted)

    visit(at, "tensors")
    contract = [f.code for f in verdict if f.code in CONTRACT_CODES + ("NOT_OBSERVED",)]
    assert _codes(texts(at, "error") + texts(at, "warning")) == contract
    assert any("contract kept" in s for s in texts(at, "success")) == (
        not contract and not any(f.code == "CHECKS_SKIPPED" for f in verdict))

    visit(at, "gpus")
    divergence = [f.code for f in verdict if f.code == "RANK_DIVERGENCE"]
    assert _codes(texts(at, "warning")) == divergence

    visit(at, "findings")
    shown = [e.label.split("**")[1] for e in at.expander]
    assert shown == ([f.code for f in verdict if f.source == "doctor"]
                     + [f.code for f in verdict if f.source == "inspect"])


def test_checkpoint_convention_warning_is_settled_by_provenance(doctor_store):
    """The healthy run's received layers were verified by fingerprint: the stored warning reads as
    info; the off-by-one run received other layers: it stays a warning, beside AUX_LAYER_MISMATCH."""
    from specscope.doctor import checkpoint_findings

    with open_store(doctor_store, create=False, read_only=True) as store:
        healthy = checkpoint_findings(store, "healthy")
        shifted = checkpoint_findings(store, "off-by-one")
        blind = checkpoint_findings(store, "draft-only")
    assert [(f.code, f.severity) for f in healthy] == [("AUX_LAYER_IDS_CONVENTION", "info")]
    assert healthy[0].evidence["verified_by_provenance"] > 0 and "fingerprint" in healthy[0].message
    assert [f.severity for f in shifted] == ["warning"] and [f.severity for f in blind] == ["warning"]


def test_sql_reference_is_plain_markdown_with_the_readme_tables(monkeypatch, two_runs):
    at = visit(app(monkeypatch, two_runs), "sql")
    text = "\n".join(m.value for m in at.markdown)
    assert "`v_tensor_contract`" in text and ":mod:" not in text and "``" not in text
    # one table of every view: its header once, no separator row inside it
    assert text.count("| view | one row per | what |") == 1 and text.count("|---|---|---|") == 1
    assert "`v_acceptance_histogram`" in text and "`v_lossless_audit`" in text
    from specscope.storage import schema

    tables = [e.label for e in at.expander]
    assert sorted(tables) == sorted(t.name for t in schema.metadata.sorted_tables)  # every one, as README lists


def test_gpus_cells_show_widths_and_the_doctors_divergence(monkeypatch, doctor_store):
    at = app(monkeypatch, doctor_store)
    at.selectbox(key="run_picker").set_value("two-ranks").run()
    visit(at, "gpus")
    cells = at.dataframe[-1].value
    row = cells[cells["hook point"] == "draft.forward:hidden_states"].iloc[0]
    assert row["ranks differ"] == "DIFFER"
    assert "…×1728 (" in row["rank 0"] and row["rank 1"].startswith("…×576 ≠ …×1728")  # breaks first
    # at most three widths named per cell, the rest counted
    assert all(len(cell.split("; ")) <= 4 for column in ("rank 0", "rank 1") for cell in cells[column])


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dash3") / "store.db"
    return write_store(path, [trace("healthy-run", world_size=2),
                              trace("faulty-run", fault="no-aux-capture", t0=1_750_000_100.0),
                              trace("other-run", t0=1_750_000_200.0)])


def test_every_pick_of_the_run_picker_takes(monkeypatch, three_runs):
    """The picker's labels change with the selection (the open run shows the doctor's counts): each
    pick, one after another, must open the run picked, on the page shown and after a page switch."""
    at = app(monkeypatch, three_runs)
    for run_id in ("healthy-run", "faulty-run", "other-run", "healthy-run", "faulty-run"):
        at.selectbox(key="run_picker").set_value(run_id).run()
        assert not at.exception
        assert at.selectbox(key="run_picker").value == run_id and at.session_state["run_id"] == run_id
        assert any(c.value.startswith(f"run `{run_id}`") for c in at.caption)  # the Overview's run line
    visit(at, "tensors")
    assert at.selectbox(key="run_picker").value == "faulty-run"


def test_no_page_script_holds_a_bare_string_streamlit_would_print():
    """Streamlit's magic writes every bare expression of a page script to the page: a string meant as
    a constant's docstring becomes a line of text on the page (docstrings of the module and of
    functions are exempt)."""
    import ast

    stray = []
    for script in [ENTRY, *sorted((ENTRY.parent / "screens").glob("*.py"))]:
        for node in ast.walk(ast.parse(script.read_text())):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            documented = isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            stray += [f"{script.name}:{stmt.lineno}" for i, stmt in enumerate(body)
                      if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                      and isinstance(stmt.value.value, str) and not (documented and i == 0)]
    assert stray == []


def test_overview_shows_a_replays_divergence(monkeypatch, tmp_path):
    """A replay against the target (``specscope replay`` stores the results and the run's verdict again)
    reaches the Overview's banner and the run picker's count like any finding."""
    import _traces as T

    from specscope.events import LosslessAudit, ReplayResult
    from specscope.readmodel import store_verdict

    path = str(tmp_path / "replayed.db")
    with open_store(path) as store:
        T.healthy().write(store)
        audit = LosslessAudit("healthy", 0, "req-0", "greedy", 24, mismatches=2)
        store.write([ReplayResult("healthy", "req-0", "/models/target", 0.25, audit, departures=2,
                                  first_departure=5, first_margin=3.5, max_margin=4.0)])
        store_verdict(store, "healthy")
    at = app(monkeypatch, path)
    errors = texts(at, "error")
    assert _codes(errors) == ["REPLAY_DIVERGENCE"] and "departs from the target served alone" in errors[0]
    assert "1 error" in at.selectbox(key="run_picker").format_func("healthy")


def _charts(at: AppTest) -> dict[str, dict]:
    return {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)
            for c in at.get("plotly_chart")}


def test_overview_shows_acceptance_per_window_and_rank_requests_its_histogram(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    at.selectbox(key="run_picker").set_value("healthy-run").run()
    windows = _charts(at)["Acceptance length per window and rank"]
    assert {trace["name"] for trace in windows["data"]} == {"rank 0", "rank 1"}  # the run has two ranks
    visit(at, "requests")
    histogram = _charts(at)["Accepted drafts per verify step"]
    (bars,) = histogram["data"]
    assert list(bars["x"]) == [0, 1, 2, 3, 4] and abs(sum(bars["y"]) - 1) < 1e-9
    assert any(c.value.startswith("Per-request acceptance length over ") for c in at.caption)


def test_requests_page_shows_acceptance_by_position_in_the_output(monkeypatch, two_runs):
    at = app(monkeypatch, two_runs)
    at.selectbox(key="run_picker").set_value("healthy-run").run()
    visit(at, "requests")
    (bars,) = _charts(at)["Acceptance length by position in the output"]["data"]
    with open_store(two_runs, read_only=True) as store:
        view = store.query("SELECT output_position, mean_acceptance_length FROM v_acceptance_by_output_position "
                           "WHERE run_id = 'healthy-run' ORDER BY output_position").rows
    # 12 steps of ~3.4 tokens per request: the first three buckets of generated length, labelled by range
    assert list(bars["x"]) == ["0–15", "16–31", "32–63"] == [f"{lo}–{2 * lo - 1 if lo else 15}" for lo, _ in view]
    assert list(bars["y"]) == pytest.approx([al for _, al in view])


def test_a_link_opens_its_run_and_the_address_follows_the_pick(monkeypatch, two_runs):
    """``?run=<run id>``: a new session opens on the run the link names, on every page, though a newer
    run exists; a pick puts the picked run in the address, so a copied link opens it."""
    monkeypatch.setenv(DB_ENV, two_runs)
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.query_params["run"] = "healthy-run"
    at.run()
    assert not at.exception and at.session_state["run_id"] == "healthy-run"
    assert not texts(at, "warning") and float(at.metric[0].value) > 2.5
    visit(at, "requests")
    assert at.session_state["run_id"] == "healthy-run" and at.query_params["run"] == "healthy-run"
    at.selectbox(key="run_picker").set_value("faulty-run").run()
    assert at.query_params["run"] == "faulty-run"


def test_a_link_to_a_run_the_store_does_not_hold_says_so_and_opens_the_newest(monkeypatch, two_runs):
    monkeypatch.setenv(DB_ENV, two_runs)
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    gone = "gone-run-" + "0" * 32  # a uuid's length and more: named whole, so it can be copied
    at.query_params["run"] = gone
    at.run()
    assert not at.exception and at.session_state["run_id"] == "faulty-run"
    (warning,) = [w for w in texts(at, "warning") if "link" in w]
    assert f"`'{gone}'`" in warning and "showing the run in the picker below" in warning
    assert at.query_params["run"] == "faulty-run"
    at.selectbox(key="run_picker").set_value("healthy-run").run()
    at.query_params["run"] = "gone-too"  # edited in the address bar: the open run stays
    at.run()
    assert at.session_state["run_id"] == "healthy-run" and any("'gone-too'" in w for w in texts(at, "warning"))
    assert at.query_params["run"] == "healthy-run"


def test_a_link_naming_a_unique_prefix_opens_that_run_and_puts_its_whole_id_in_the_address(monkeypatch, two_runs):
    """The short ids the pages show work in a link, as in ``--run``; a prefix of several runs says so."""
    monkeypatch.setenv(DB_ENV, two_runs)
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.query_params["run"] = "heal"
    at.run()
    assert not at.exception and at.session_state["run_id"] == "healthy-run" and not texts(at, "warning")
    assert at.query_params["run"] == "healthy-run"
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.query_params["run"] = "-run"  # no run id starts with it
    at.run()
    assert at.session_state["run_id"] == "faulty-run"
    (warning,) = [w for w in texts(at, "warning") if "link" in w]
    assert "no run" in warning and "showing the run in the picker below" in warning


def test_a_link_naming_a_prefix_of_several_runs_names_them(monkeypatch, tmp_path):
    db = write_store(tmp_path / "store.db", [trace("run-a"), trace("run-b", t0=1_750_000_100.0)])
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.query_params["run"] = "run-"
    at.run()
    assert not at.exception and at.session_state["run_id"] == "run-b"
    (warning,) = [w for w in texts(at, "warning") if "link" in w]
    assert "ambiguous" in warning and "run-a" in warning and "run-b" in warning


@pytest.mark.parametrize("link", ["faulty-run\x00", "x" * 100_000], ids=["NUL", "100k characters"])
def test_a_link_no_run_id_can_be_warns_and_opens_the_newest_run(monkeypatch, store_url, link):
    """A NUL in a link reached PostgreSQL's comparison and ended every page on "Reading the store
    failed" (the address keeps the link); a pasted page was echoed whole in the warning."""
    write_store(store_url, [trace("healthy-run"), trace("faulty-run", t0=1_750_000_100.0)])
    monkeypatch.setenv(DB_ENV, store_url)
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.query_params["run"] = link
    at.run()
    assert not at.exception and not texts(at, "error") and at.session_state["run_id"] == "faulty-run"
    (warning,) = [w for w in texts(at, "warning") if "link" in w]
    assert "showing the run in the picker below" in warning and len(warning) < 2_000
    assert at.query_params["run"] == "faulty-run"


def delete_runs(db: str, where: str) -> None:
    """Delete every row of the runs ``where`` selects (a run without its ``runs`` row is still listed)."""
    with sa.create_engine(f"sqlite:///{db}").begin() as conn:
        for table in schema.metadata.sorted_tables:
            if "run_id" in table.c:
                conn.exec_driver_sql(f"DELETE FROM {table.name} WHERE {where}")


def test_an_open_run_deleted_from_the_store_is_named_when_the_newest_replaces_it(monkeypatch, tmp_path):
    db = write_store(tmp_path / "store.db", [trace("old-run"), trace("new-run", t0=1_750_000_100.0)])
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    at.selectbox(key="run_picker").set_value("old-run").run()
    assert at.session_state["run_id"] == "old-run" and not texts(at, "warning")
    delete_runs(db, "run_id = 'old-run'")
    time.sleep(2.1)  # past the run list's cache
    at.run()
    assert not at.exception and at.session_state["run_id"] == "new-run"
    (warning,) = texts(at, "warning")
    assert "`'old-run'`" in warning and "no longer in this store" in warning
    at.run()
    assert not texts(at, "warning")  # said once: the newest run is the open one now


def test_a_store_emptied_and_written_again_opens_its_new_run_unannounced(monkeypatch, tmp_path):
    db = write_store(tmp_path / "store.db", [trace("old-run"), trace("new-run", t0=1_750_000_100.0)])
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    at.selectbox(key="run_picker").set_value("old-run").run()
    delete_runs(db, "1 = 1")
    time.sleep(2.1)  # past the run list's cache
    at.run()  # the "Get started" page
    write_store(db, [trace("later-run", t0=1_750_000_300.0)])
    time.sleep(2.1)
    at.run()
    assert not at.exception and at.session_state["run_id"] == "later-run" and not texts(at, "warning")


def test_back_and_forward_follow_the_address(monkeypatch, two_runs):
    """Going back in the browser reruns the page with the address it went back to: the run it names
    opens (the session's own pick no longer holds it on the run it left), and the address is not
    written again, which would add a history entry and trap Back on the page."""
    monkeypatch.setenv(DB_ENV, two_runs)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    assert at.query_params["run"] == "faulty-run"
    at.selectbox(key="run_picker").set_value("healthy-run").run()
    assert at.query_params["run"] == "healthy-run"
    at.query_params["run"] = "faulty-run"  # Back
    at.run()
    assert at.session_state["run_id"] == "faulty-run" and not texts(at, "warning")
    assert at.selectbox(key="run_picker").value == "faulty-run"
    visit(at, "gpus")  # a page switch keeps the address, and the run
    assert at.session_state["run_id"] == "faulty-run"


def test_a_link_to_a_run_younger_than_the_cached_run_list_opens_it(monkeypatch, tmp_path):
    """The run list is cached for 2 s: a link to a run written meanwhile (a colleague's fresh run)
    is looked up in the store itself before the page says the store does not hold it."""
    db = write_store(tmp_path / "store.db", [trace("old-run")])
    monkeypatch.setenv(DB_ENV, db)
    assert AppTest.from_file(str(ENTRY), default_timeout=60).run().session_state["run_id"] == "old-run"
    write_store(db, [trace("new-run", t0=1_750_000_100.0)])
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.query_params["run"] = "new-run"
    at.run()
    assert not at.exception and not texts(at, "warning")
    assert at.session_state["run_id"] == "new-run" and at.selectbox(key="run_picker").value == "new-run"
