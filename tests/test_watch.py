"""`specscope watch`: engines' Prometheus counters, scraped from a real local HTTP server that changes
them between scrapes (with a restart and an outage), stored so the views and the doctor read them."""

from __future__ import annotations

import logging
import random

import pytest
from _exposition import (
    ChainCounters,
    MetricsServer,
    llamacpp_exposition,
    sglang_exposition,
    trtllm_exposition,
    vllm_exposition,
)

from specscope import metrics
from specscope.adapters.prometheus_metrics import Reading, is_reset, parse_exposition, window
from specscope.adapters.prometheus_watch import Watcher, normalize_endpoint
from specscope.cli import main
from specscope.doctor import diagnose
from specscope.storage import open_store

K = 3


@pytest.fixture
def server():
    srv = MetricsServer()
    yield srv
    srv.close()


def _draw(rng: random.Random, choices: list[int], n: int) -> list[int]:
    return [rng.choice(choices) for _ in range(n)]


def _acceptance(store, run_id: str, rank: int | None = None) -> tuple:
    where = f"run_id = '{run_id}'" + ("" if rank is None else f" AND rank = {rank}")
    view = "v_run_acceptance" if rank is None else "v_rank_acceptance"
    return store.query(f"SELECT verify_steps, proposed, accepted, mean_acceptance_length, acceptance_rate "
                       f"FROM {view} WHERE {where}")[1][0]


def _positions(store, run_id: str) -> list[float]:
    return [p for (p,) in store.query(f"SELECT acceptance FROM v_position_acceptance WHERE run_id = '{run_id}' "
                                      "ORDER BY position")[1]]


def test_vllm_counters_with_a_restart_and_an_outage_equal_the_engine_figures(server, tmp_path, caplog) -> None:
    rng = random.Random(1)
    engines = {"0": ChainCounters(K), "1": ChainCounters(K)}
    engines["0"].add(_draw(rng, [0, 3], 50))  # traffic before the watch started: not in the window
    server.body = vllm_exposition("smollm2", engines)
    seen = {"0": [], "1": []}

    def serve(batch: int) -> None:
        for engine, choices in (("0", [0, 1, 2, 3, 3]), ("1", [0, 1, 1, 2])):
            steps = _draw(rng, choices, batch)
            engines[engine].add(steps)
            seen[engine] += steps
        server.body = vllm_exposition("smollm2", engines)

    caplog.set_level(logging.WARNING, logger="specscope.watch")
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [server.url]) as watcher:
        assert [r.verify_steps for r in watcher.scrape()] == [0]  # baseline
        serve(40)
        assert [r.verify_steps for r in watcher.scrape()] == [80]
        serve(30)
        watcher.scrape()
        engines.update({"0": ChainCounters(K), "1": ChainCounters(K)})  # the server restarts: counters from 0
        serve(20)
        assert [r.verify_steps for r in watcher.scrape()] == [40]
        server.status, server.body = 503, "Service Unavailable"
        down = watcher.scrape() + watcher.scrape()
        serve(10)  # steps served while the endpoint was unreachable
        assert [r.ok for r in down] == [False, False] and "503" in down[0].error
        server.status = 200
        assert [r.verify_steps for r in watcher.scrape()] == [20]
        (run_id,) = watcher.run_ids
        all_steps = seen["0"] + seen["1"]
        expected = (len(all_steps), K * len(all_steps), sum(all_steps),
                    metrics.mean_acceptance_length(all_steps),
                    metrics.acceptance_rate(all_steps, [K] * len(all_steps)))
        assert _acceptance(store, run_id) == pytest.approx(expected)
        for rank, engine in enumerate(("0", "1")):
            assert _acceptance(store, run_id, rank)[3] == pytest.approx(
                metrics.mean_acceptance_length(seen[engine]))
        assert _positions(store, run_id) == pytest.approx(metrics.per_position_acceptance(metrics.chain_mask(a, K) for a in all_steps))
        devices = store.query(f"SELECT rank, device FROM run_ranks WHERE run_id = '{run_id}' ORDER BY rank")[1]
        assert devices == [(0, "engine=0"), (1, "engine=1")]
        status = f"SELECT engine, target_model, world_size, status FROM v_run_summary WHERE run_id = '{run_id}'"
        assert store.query(status)[1] == [("vllm", "smollm2", 2, "running")]
        watcher.close()
        assert store.query(status)[1] == [("vllm", "smollm2", 2, "finished")]
    gap_lines = [r for r in caplog.records if r.name == "specscope.watch"]
    assert len(gap_lines) == 1 and server.url in gap_lines[0].getMessage()


def _watch_two_scrapes(store, server, before: str, after: str) -> str:
    with Watcher(store, [server.url]) as watcher:
        server.body = before
        watcher.scrape()
        server.body = after
        watcher.scrape()
        return watcher.run_ids[0]


def test_a_reading_cut_short_of_a_counter_waits_for_the_next_complete_one(server, tmp_path, caplog) -> None:
    """One scrape's answer lacks ``num_accepted_tokens`` (cut off): that series is skipped with one
    warning, and the next complete answer counts the whole increase, never the counter from 0."""
    rng = random.Random(3)
    engines = {"0": ChainCounters(K)}
    server.body = vllm_exposition("m", engines)
    served: list[int] = []

    def serve(n: int, cut: bool = False) -> None:
        steps = _draw(rng, [0, 1, 2, 3], n)
        engines["0"].add(steps)
        served.extend(steps)
        body = vllm_exposition("m", engines)
        server.body = "\n".join(line for line in body.splitlines()
                                if not (cut and "num_accepted_tokens" in line and "per_pos" not in line)) + "\n"

    caplog.set_level(logging.WARNING, logger="specscope.watch")
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [server.url]) as watcher:
        watcher.scrape()
        serve(40)
        assert [r.verify_steps for r in watcher.scrape()] == [40]
        serve(30, cut=True)
        assert [r.verify_steps for r in watcher.scrape()] == [0]
        serve(20)
        assert [r.verify_steps for r in watcher.scrape()] == [50]
        (run_id,) = watcher.run_ids
        assert _acceptance(store, run_id)[:3] == (len(served), K * len(served), sum(served))
    assert sum("lacks accepted" in r.getMessage() for r in caplog.records) == 1


def test_a_series_whose_windows_stay_impossible_counts_on_from_its_current_reading(server, tmp_path, caplog) -> None:
    """Per-position counters missing from one answer read as a restart (llama.cpp creates them at a
    server's first draft); when they come back whole, every window from that reading is no engine's.
    Twice in a row, and the series counts on from its current reading instead of staying dark."""
    engines = {"0": ChainCounters(K)}
    server.body = vllm_exposition("m", engines)

    def serve(n: int, cut: bool = False) -> None:
        engines["0"].add([2] * n)
        body = vllm_exposition("m", engines)
        server.body = "\n".join(line for line in body.splitlines() if not (cut and "per_pos" in line)) + "\n"

    caplog.set_level(logging.WARNING, logger="specscope.watch")
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [server.url]) as watcher:
        watcher.scrape()
        counted = []
        for n, cut in ((40, False), (30, True), (20, False), (10, False), (10, False), (5, False)):
            serve(n, cut)
            counted += [r.verify_steps for r in watcher.scrape()]
        for _ in range(4):  # then an engine whose every window is no engine's: said once
            engines["0"].accepted += 10_000
            serve(5)
            watcher.scrape()
    assert counted == [40, 70, 0, 0, 10, 5]  # the cut answer read as a restart; two dark scrapes, then on
    assert sum("counting it from its current reading" in r.getMessage() for r in caplog.records) == 2


def test_vllm_rank_divergence_and_collapse_reach_the_doctor(server, tmp_path) -> None:
    rng = random.Random(2)
    before = {"0": ChainCounters(K), "1": ChainCounters(K)}
    after = {"0": ChainCounters(K), "1": ChainCounters(K)}
    after["0"].add(_draw(rng, [1, 2, 3], 60))
    after["1"].add([0] * 60)
    with open_store(str(tmp_path / "w.db")) as store:
        run_id = _watch_two_scrapes(store, server, vllm_exposition("m", before), vllm_exposition("m", after))
        codes = diagnose(store, run_id).codes()
        collapsed = {"0": ChainCounters(K)}
        start = vllm_exposition("m", collapsed)
        collapsed["0"].add([0] * 59 + [1])
        collapse_run = _watch_two_scrapes(store, server, start, vllm_exposition("m", collapsed))
        assert diagnose(store, collapse_run).codes() == ["ACCEPT_COLLAPSE", "CHECKS_SKIPPED"]  # no hooks
    assert codes == ["RANK_DIVERGENCE", "CHECKS_SKIPPED"]


def test_llamacpp_position0_low(server, tmp_path) -> None:
    c = ChainCounters(K)
    before = llamacpp_exposition(c)
    c.add([0] * 30 + [3] * 10)
    with open_store(str(tmp_path / "w.db")) as store:
        run_id = _watch_two_scrapes(store, server, before, llamacpp_exposition(c))
        assert _positions(store, run_id) == pytest.approx([0.25, 0.25, 0.25])
        assert store.query(f"SELECT engine FROM runs WHERE run_id = '{run_id}'")[1] == [("llama.cpp",)]
        assert diagnose(store, run_id).codes() == ["POSITION0_LOW", "CHECKS_SKIPPED"]


def test_trtllm_positions_from_one_and_saturation(server, tmp_path) -> None:
    c = ChainCounters(K)
    c.add([1, 2])
    before = trtllm_exposition("m", c)
    c.add([K] * 20)
    with open_store(str(tmp_path / "w.db")) as store:
        run_id = _watch_two_scrapes(store, server, before, trtllm_exposition("m", c))
        assert _acceptance(store, run_id) == pytest.approx((20, 20 * K, 20 * K, 1.0 + K, 1.0))
        assert _positions(store, run_id) == pytest.approx([1.0, 1.0, 1.0])
        assert diagnose(store, run_id).codes() == ["ACCEPT_SATURATED", "CHECKS_SKIPPED"]


def test_sglang_gauges_are_converted_to_one_definition(server, tmp_path) -> None:
    """SGLang's accept length includes the bonus (accepted per step = length - 1) and its rate divides
    by steps x (num_draft_tokens - 1): 2.5 tokens/step at rate 0.5 is k = 3, 1.5 accepted per step."""
    with open_store(str(tmp_path / "w.db")) as store:
        run_id = _watch_two_scrapes(store, server, sglang_exposition({0: (2.0, 0.4, 100), 1: (2.0, 0.4, 100)}),
                                    sglang_exposition({0: (2.5, 0.5, 140), 1: (2.5, 0.5, 140)}))
        assert _acceptance(store, run_id, 0) == pytest.approx((40, 120, 60, 2.5, 0.5))
        assert _acceptance(store, run_id) == pytest.approx((80, 240, 120, 2.5, 0.5))
        assert _positions(store, run_id) == []  # SGLang exposes no per-position figures
        devices = [d for (d,) in store.query("SELECT device FROM run_ranks ORDER BY rank")[1]]
    assert devices == ["dp_rank=0,pp_rank=0,tp_rank=0", "dp_rank=0,pp_rank=0,tp_rank=1"]


@pytest.mark.parametrize("body", ["<html>not metrics</html>", "# HELP x y\nunrelated_metric 1\n"])
def test_garbage_is_a_gap_not_a_crash(server, tmp_path, body: str) -> None:
    server.body = body
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [server.url]) as watcher:
        (result,) = watcher.scrape()
        assert not result.ok and "ValueError" in result.error
        assert store.query("SELECT COUNT(*) FROM runs")[1] == [(0,)]


def test_unreachable_endpoint_is_a_gap(tmp_path) -> None:
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, ["127.0.0.1:9"], timeout_s=2) as watcher:
        (result,) = watcher.scrape()
    assert not result.ok and result.endpoint == "http://127.0.0.1:9/metrics"


def test_window_counts_new_counters_from_zero_and_a_reset_from_zero() -> None:
    def reading(steps: float, accepted: float, positions: dict[int, float]) -> Reading:
        return Reading("llama.cpp", "", (), {"steps": steps, "proposed": 3 * steps, "accepted": accepted},
                       {"accepted_pos": positions})

    before, later = reading(10, 6, {}), reading(15, 9, {0: 2, 1: 1})
    assert window(None, before).steps == 0  # the first sample is the baseline
    assert window(before, later).accepted_pos == (2, 1)  # created after the baseline: from 0
    assert window(reading(10, 6, {0: 4, 1: 2}), reading(13, 9, {0: 6, 1: 3})).accepted_pos == (2, 1)
    restarted = reading(20, 12, {0: 1})  # more steps than before, yet position 1 is gone: a restart
    assert is_reset(reading(15, 9, {0: 2, 1: 1}), restarted)
    assert window(later, restarted).steps == 20
    assert window(later, reading(4, 1, {0: 1})).steps == 4  # a counter went down: from 0, never negative


def test_parse_rejects_text_that_is_not_an_exposition() -> None:
    with pytest.raises(ValueError):
        parse_exposition("{json: 1}")
    assert normalize_endpoint("host:8000") == "http://host:8000/metrics"
    assert normalize_endpoint("https://h/custom") == "https://h/custom"


def test_watch_cli_counts_scrapes_and_refuses_bad_arguments(server, tmp_path, capsys) -> None:
    c = ChainCounters(K)
    server.body = llamacpp_exposition(c)
    db = str(tmp_path / "w.db")
    assert main(["watch", "--db", db, "--interval", "10ms", "--count", "2", server.url]) == 0
    assert "llama.cpp" in capsys.readouterr().out
    with open_store(db) as store:
        assert store.query("SELECT COUNT(*) FROM runs")[1] == [(1,)]
    with pytest.raises(SystemExit) as exit_info:
        main(["watch", "--db", db, "--interval", "soon", server.url])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["watch", "--db", db, "--count", "1", "http://"]) == 2  # no host: one line, exit 2
    assert "names no host" in capsys.readouterr().err
    for endpoint, said in (("ftp://127.0.0.1:9/metrics", "not ftp://"), ("127.0.0.1:99999", "out of range"),
                           ("127.0.0.1:abc", "integer")):
        assert main(["watch", "--db", db, "--count", "1", endpoint]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as exit_info:
        main(["watch", "--db", db, "--interval", "2600000h", server.url])
    assert exit_info.value.code == 2 and "longer than a year" in capsys.readouterr().err


def test_gap_warnings_keep_an_endpoints_credentials_out_of_the_log(server, tmp_path, caplog) -> None:
    server.status, server.body = 503, "Service Unavailable"
    host = server.url.split("://", 1)[1]
    secret = f"http://user:secretpw@{host}?token=SECRET"
    caplog.set_level(logging.WARNING, logger="specscope.watch")
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [secret]) as watcher:
        (result,) = watcher.scrape()
    assert not result.ok and caplog.records
    assert not [r for r in caplog.records if "secretpw" in r.getMessage() or "SECRET" in r.getMessage()]


def test_overview_requests_and_gpus_pages_show_a_watched_server(server, tmp_path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from specscope.app import DB_ENV, ENTRY

    rng = random.Random(3)
    before = {"0": ChainCounters(K), "1": ChainCounters(K)}
    after = {"0": ChainCounters(K), "1": ChainCounters(K)}
    for engine in after.values():
        engine.add(_draw(rng, [0, 1, 2, 3], 40))
    db = str(tmp_path / "w.db")
    with open_store(db) as store:
        _watch_two_scrapes(store, server, vllm_exposition("m", before), vllm_exposition("m", after))
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    metrics_shown = {m.label: m.value for m in at.metric}
    assert metrics_shown["Verify steps"] == "80"
    assert any("mode not hooked" in c.value for c in at.caption)  # its producer's 'eager' is no observation
    for page in ("gpus", "requests", "tensors", "findings"):
        at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
        if page == "tensors":
            assert [i.value for i in at.info if i.value.startswith("Not hooked")], [i.value for i in at.info]
    with open_store(db, read_only=True) as store:
        (skipped,) = [f for f in diagnose(store).findings if f.code == "CHECKS_SKIPPED"]
    assert "watched through its Prometheus endpoint: no hooks" in skipped.message
    assert skipped.fix.startswith("Recorded from outside the server") and "Tracer(" not in skipped.fix


def test_a_refused_store_write_loses_no_window(server, tmp_path) -> None:
    """The store refuses one scrape's write (another connection holds SQLite's write lock); once it is
    released, the next scrapes store the run, its ranks and the whole increase."""
    import sqlite3

    from specscope.errors import StoreError

    c = ChainCounters(K)
    server.body = llamacpp_exposition(c)
    db = str(tmp_path / "w.db")
    with open_store(db, busy_timeout_s=0.1) as store, Watcher(store, [server.url]) as watcher:
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreError, match="locked"):
            watcher.scrape()
        blocker.execute("ROLLBACK")
        blocker.close()
        assert watcher.run_ids == []
        watcher.scrape()  # the baseline, now stored
        c.add([1, 2, 3, 0])
        server.body = llamacpp_exposition(c)
        assert [r.verify_steps for r in watcher.scrape()] == [4]
        assert store.query("SELECT COUNT(*), MAX(world_size) FROM runs")[1] == [(1, 1)]


def test_window_groups_rebuild_a_chain_and_fall_back_without_one() -> None:
    from specscope.adapters.prometheus_metrics import Window, window_groups

    def groups(w: Window) -> list[tuple]:
        return [(g.accepted_mask, g.steps, g.proposed, g.accepted)
                for g in window_groups(w, run_id="r", request_id="watch", rank=0, ts_wall=1.0)]

    # 10 steps, p = (6, 3, 1): 4 accepted none, 3 one, 2 two, 1 three; 29 proposed (one step short)
    assert groups(Window(10, 29, 10, (6, 3, 1))) == [
        ("000", 4, 12, 0), ("100", 3, 9, 3), ("110", 2, 5, 4), ("111", 1, 3, 3)]
    # 10 steps of k = 4 that drafted one token each (vLLM near its token limit): no group proposes
    # fewer than it accepted, none a negative count, the totals are the window's
    fewer = groups(Window(10, 10, 5, (5, 0, 0, 0)))
    assert fewer == [("0000", 5, 5, 0), ("1000", 5, 5, 5)]
    assert groups(Window(10, 30, 9, (3, 6, 0))) == [("", 10, 30, 9)]  # not a chain: no positions
    assert groups(Window(0, 0, 0)) == []


def test_a_watch_no_endpoint_answers_fails_and_stores_nothing(server, tmp_path, capsys, caplog) -> None:
    """A dead endpoint and one answering no metrics: exit 2, the last line naming each endpoint's
    error, no run stored; one live endpoint beside a dead one is watched, and the dead one named."""
    server.body = "<html>not metrics</html>"
    db = str(tmp_path / "w.db")
    caplog.set_level(logging.WARNING, logger="specscope.watch")
    assert main(["watch", "--db", db, "--count", "1", "--timeout", "2s", "127.0.0.1:9", server.url]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no endpoint gave speculative-decoding metrics in 1 scrape(s), nothing stored" in last
    assert "http://127.0.0.1:9/metrics (ConnectError" in last and f"{server.url} (ValueError" in last
    with open_store(db) as store:
        assert store.query("SELECT COUNT(*) FROM runs")[1] == [(0,)]
    caplog.clear()
    server.body = llamacpp_exposition(ChainCounters(K))
    assert main(["watch", "--db", db, "--count", "1", "--timeout", "2s", "127.0.0.1:9", server.url]) == 0
    assert "llama.cpp" in capsys.readouterr().out
    assert any("127.0.0.1:9/metrics gave no metrics in the whole watch" in r.getMessage() for r in caplog.records)


def test_watch_says_what_each_scrape_stored(server, tmp_path, caplog) -> None:
    c = ChainCounters(K)
    server.body = llamacpp_exposition(c)
    caplog.set_level(logging.INFO, logger="specscope.watch")
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [server.url]) as watcher:
        watcher.scrape()  # the Watcher itself logs no line per scrape: watch() does
    assert not caplog.records
    assert main(["watch", "--db", str(tmp_path / "w.db"), "--interval", "10ms", "--count", "2", server.url]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "watch: scrape 1 (the baseline): 1 of 1 endpoint(s) answered, 0 verify step(s) stored",
        "watch: scrape 2: 1 of 1 endpoint(s) answered, 0 verify step(s) stored"]


def test_a_watched_run_names_the_losslessness_audit_as_not_checked(server, tmp_path) -> None:
    """A server's counters carry no logits: however its output reads, its run cannot pass or fail the
    audit, and CHECKS_SKIPPED says so beside the draft-input contract."""
    c = ChainCounters(K)
    before = llamacpp_exposition(c)
    c.add([1, 2, 3] * 10)
    with open_store(str(tmp_path / "w.db")) as store:
        run_id = _watch_two_scrapes(store, server, before, llamacpp_exposition(c))
        (skipped,) = [f for f in diagnose(store, run_id).findings if f.code == "CHECKS_SKIPPED"]
    assert "losslessness audit (watched through its Prometheus endpoint: no target logits" in skipped.message
    assert ["LOSSLESS_VIOLATION", "LOSSLESS_AUDITED"] in [s["codes"] for s in skipped.evidence["not_checked"]]
