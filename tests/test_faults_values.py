"""One bad value costs only itself (issue 23): values no database column can hold, in a batch of good
events, through a real Collector into real SQLite and PostgreSQL stores; flush() reporting every
drop; close() while other threads keep emitting; the store deleted mid-run; the tracer's request
calls given nonsense. Each bad value is set aside alone, counted, and never costs another event."""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
from pathlib import Path

import pytest
from _list_sink import ListSink

from specscope import events as ev
from specscope.collector import Collector
from specscope.errors import EventRejected, InvalidEvent, StoreError
from specscope.instrumentation import Tracer
from specscope.storage import Store, open_store

RUN = "run-v"
GOOD = 5_000
HANG = 120.0  # a flush / join still waiting after this long is a hang (detector, not a timing check)


def _step(i: int, **changes) -> ev.VerifyStep:
    return ev.VerifyStep(**{**dict(run_id=RUN, request_id=f"q{i % 50}", rank=0, step=i, proposed=2,
                                   accepted=1, draft_s=0.01, verify_s=0.02, emitted=("a", "b"),
                                   ts_wall=1000.0 + i), **changes})


def _nested(depth: int) -> tuple:
    value: tuple = ("x",)
    for _ in range(depth):
        value = (value,)
    return value


def _bypass(event: ev.VerifyStep, **fields) -> ev.VerifyStep:
    """The event with fields set past its constructor's checks, as a producer outside the tracer
    (or a future bug) could hand the collector."""
    for name, value in fields.items():
        object.__setattr__(event, name, value)
    return event


def _start(request_id: str, **changes) -> ev.RequestStart:
    return ev.RequestStart(**{**dict(run_id=RUN, request_id=request_id, rank=0, prompt_tokens=3,
                                     ts_wall=999.0), **changes})


# name -> a bad event of that kind (each alone must be set aside); bad steps are numbered past the good
# ones, since a step stored again under its (run, request, rank, step) is a duplicate and dropped as one
BAD = {
    "lone surrogate in request_id": lambda: _start("q\udcff"),
    "lone surrogate in text": lambda: ev.RequestEnd(run_id=RUN, request_id="q1", rank=0, output_tokens=3,
                                                    verify_steps=1, text="bad \ud800 text"),
    "NUL in request_id": lambda: _start("q\x00"),
    "int >= 2**64": lambda: _bypass(_step(1), step=2**64),
    "emitted nested past the recursion limit": lambda: _bypass(_step(GOOD + 2), emitted=_nested(5_000)),
    "draft_s as a list": lambda: _step(GOOD + 3, draft_s=[0.1, 0.2]),
    "verify_s as a string": lambda: _step(GOOD + 4, verify_s="0.02"),
    # values the summary folds cannot take (a wall-clock second of infinity, a mask of 10**30 places)
    "ts_wall infinite": lambda: _bypass(_step(GOOD + 5), ts_wall=math.inf),
    "accepted past 64 bits": lambda: _bypass(_step(GOOD + 6), accepted=10**30),
    "draft input's ts_wall infinite": lambda: ev.TensorEvent(
        run_id=RUN, rank=0, hook_point="draft.forward:hidden_states", call_index=0, shape=(5, 1728),
        dtype="torch.float32", device="cpu", expected_shape=(-1, 1728), ts_wall=math.inf),
}


# what SQLite stores as it is (its text may hold NUL; a REAL column keeps a string as text): nothing
# is lost there either; PostgreSQL refuses both, and then the event alone is set aside
STORED_BY_SQLITE = {"NUL in request_id", "verify_s as a string"}


def _rejected(bad: str, url: str) -> int:
    return 0 if bad in STORED_BY_SQLITE and not url.startswith("postgresql") else 1


def _count(store: Store, table: str) -> int:
    return store.query(f"SELECT COUNT(*) FROM {table}").rows[0][0]


@pytest.mark.parametrize("bad", list(BAD))
def test_one_bad_value_costs_only_itself(bad: str, store_url: str) -> None:
    with open_store(store_url) as store, Collector(store, batch_size=GOOD + 10, flush_interval_s=60) as c:
        c.emit(ev.RunStart(run_id=RUN, engine="e", engine_version="1", target_model="t", draft_model="d",
                           config={}, ts_wall=1.0))
        for i in range(GOOD // 2):
            c.emit(_step(i))
        c.emit(BAD[bad]())
        for i in range(GOOD // 2, GOOD):
            c.emit(_step(i))
        rejected = _rejected(bad, store_url)
        assert c.flush(HANG) is not bool(rejected)  # one was dropped: flush says so
        assert (c.written, c.dropped, c.rejected) == (GOOD + 2 - rejected, rejected, rejected)
        assert c.flush(HANG)  # nothing dropped since
        c.close()
        assert _count(store, "verify_steps") >= GOOD
        assert store.query("SELECT events_written, events_dropped FROM run_ranks").rows == [
            (GOOD + 2 - rejected, rejected)]


@pytest.mark.parametrize("bad", list(BAD))
def test_store_write_names_the_bad_value(bad: str, store_url: str) -> None:
    if not _rejected(bad, store_url):
        pytest.skip("SQLite stores this value as it is")
    with open_store(store_url) as store, pytest.raises(EventRejected) as info:
        store.write([_start("q1"), BAD[bad]()])
    assert "\n" not in str(info.value)


def test_flush_reports_drops_of_a_full_buffer(tmp_path: Path) -> None:
    """A full queue drops events: flush() answers False (it answered True with 290,001 dropped)."""
    with Collector(str(tmp_path / "s.db"), capacity=100, batch_size=10, flush_interval_s=60) as c:
        for i in range(1_000):
            c.emit(_step(i))
        assert c.dropped >= 800
        assert not c.flush(HANG)
        assert c.flush(HANG)


def test_close_returns_while_threads_keep_emitting(store_url: str) -> None:
    """close() used to wait for an empty queue while emitters kept filling it: now what is emitted
    once close began is dropped and counted, and close returns."""
    stop = threading.Event()
    with open_store(store_url) as store:
        c = Collector(store, capacity=1_000, batch_size=100, flush_interval_s=0.01)

        def emitter(offset: int) -> None:
            i = 0
            while not stop.is_set():
                c.emit(_step(offset + i))
                i += 1

        threads = [threading.Thread(target=emitter, args=(n * 10**9,)) for n in range(2)]
        for thread in threads:
            thread.start()
        try:
            while c.written < 300:  # the writer is busy with a steady stream
                c.flush(HANG)
            closer = threading.Thread(target=c.close)
            closer.start()
            closer.join(HANG)
            assert not closer.is_alive()
        finally:
            stop.set()
            for thread in threads:
                thread.join(HANG)
        assert c.dropped > 0 and not c.flush(HANG)
        assert _count(store, "verify_steps") == c.written


def test_deleting_the_store_mid_run_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The SQLite file deleted under a running collector: writes stop with an error logged once,
    events are counted as dropped and flush() answers False (it answered True, everything lost)."""
    path = tmp_path / "s.db"
    with caplog.at_level(logging.ERROR, logger="specscope"), Collector(str(path), flush_interval_s=60) as c:
        c.emit(_step(0))
        assert c.flush(HANG)
        path.unlink()
        for i in range(1, 11):
            c.emit(_step(i))
        assert not c.flush(HANG)
        assert (c.written, c.dropped) == (1, 10)
    assert any("deleted or replaced" in r.getMessage() for r in caplog.records)
    with pytest.raises(StoreError, match="deleted or replaced"):
        store = open_store(str(tmp_path / "t.db"))
        try:
            (tmp_path / "t.db").unlink()
            store.write([_step(0)])
        finally:
            store.close()


def _tracer(sink: ListSink) -> Tracer:
    config = ev.RunConfig(aux_layer_ids_resolved=(2,), target_hidden_size=8, expected_fused_width=8, k=2,
                          num_target_layers=4)
    return Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d", config=config)


@pytest.mark.parametrize("calls, errors", [
    ([("start", "q", 3), ("finish", "q", 5), ("finish", "q", 9)], 1),  # the second finish
    ([("finish", "ghost", 5)], 1),  # never started
    ([("start", "q", -1), ("finish", "q", 2)], 2),  # negative prompt: never registered
    ([("start", "q", 3), ("finish", "q", -4)], 1),  # negative output tokens
    ([("start", "q", math.nan), ("finish", "q", 2)], 2),  # NaN: not half-registered
    ([("start", "q", 2.5)], 1),
])
def test_request_calls_given_nonsense_are_counted_never_raised(calls: list, errors: int) -> None:
    sink = ListSink()
    with _tracer(sink) as tracer:
        for what, request_id, tokens in calls:
            if what == "start":
                tracer.start_request(request_id, tokens)
            else:
                tracer.finish_request(request_id, tokens)
    assert tracer.hook_errors == errors
    starts, ends = sink.of(ev.RequestStart), sink.of(ev.RequestEnd)
    assert all(e.prompt_tokens >= 0 for e in starts) and all(e.output_tokens >= 0 for e in ends)
    assert len(ends) <= len(starts) and len({e.request_id for e in ends}) == len(ends)



def test_a_request_id_served_again_is_its_own_request(store: Store) -> None:
    """A harness that numbers every round from req-0: each serving after the first is stored as
    ``<id>#2``, ... (the store keeps the first of each numbered step, so a second serving numbered from
    step 0 again was dropped whole). Here the draft collapses in the second round: the doctor names it
    (the first round alone read healthy, AL 4). Restarting a request still under way stays one request."""
    from specscope.doctor import diagnose

    sink = ListSink()
    with _tracer(sink) as tracer:
        for accepted in (3, 0):
            for i in range(4):
                tracer.start_request(f"req-{i}", 5, temperature=0.0)
                if accepted == 3 and i == 0:
                    tracer.start_request("req-0", 5, temperature=0.0)  # the engine restarting it
                for _ in range(10):
                    tracer.record_verify(f"req-{i}", 4, accepted)
                tracer.finish_request(f"req-{i}", 10 * (accepted + 1))
    assert tracer.hook_errors == 0
    store.write(sink.events)
    rows = store.query("SELECT request_id, verify_steps, output_tokens FROM requests ORDER BY request_id").rows
    assert rows == [(f"req-{i}{suffix}", 10, tokens) for i in range(4) for suffix, tokens in (("", 40), ("#2", 10))]
    counts = store.query("SELECT request_id, COUNT(*), SUM(accepted) FROM verify_steps GROUP BY request_id "
                         "ORDER BY request_id").rows
    assert counts == [(f"req-{i}{suffix}", 10, total) for i in range(4) for suffix, total in (("", 30), ("#2", 0))]
    assert "ACCEPT_COLLAPSE" in diagnose(store, tracer.run_id).codes()


def _servings(calls: list[tuple[str, str]]) -> list[str]:
    """The stored id each ``("start" | "finish", engine id)`` call names."""
    from specscope.instrumentation._request_ids import RequestIds

    ids, named = RequestIds(), []
    for what, request_id in calls:
        if what == "start":
            named.append(ids.start(request_id))
        else:
            named.append(ids.stored(request_id))
            ids.finish(request_id)
    return named


@pytest.mark.parametrize(("calls", "named"), [
    # the engine's own req-0#2 served before req-0's second serving: that one is req-0#3
    ([("start", "req-0"), ("finish", "req-0"), ("start", "req-0#2"), ("finish", "req-0#2"), ("start", "req-0")],
     ["req-0", "req-0", "req-0#2", "req-0#2", "req-0#3"]),
    # ... and under way at once
    ([("start", "req-0"), ("finish", "req-0"), ("start", "req-0#2"), ("start", "req-0")],
     ["req-0", "req-0", "req-0#2", "req-0#3"]),
    # the engine's req-0#2 arriving while req-0's second serving holds that name, and after it
    ([("start", "req-0"), ("finish", "req-0"), ("start", "req-0"), ("start", "req-0#2"), ("finish", "req-0"),
      ("finish", "req-0#2"), ("start", "req-0#2")],
     ["req-0", "req-0", "req-0#2", "req-0#2#1", "req-0#2", "req-0#2#1", "req-0#2#2"]),
    # started again under way: still that serving
    ([("start", "q"), ("start", "q"), ("finish", "q"), ("start", "q")], ["q", "q", "q", "q#2"]),
])
def test_each_serving_of_an_id_is_stored_under_a_name_of_its_own(calls, named) -> None:
    assert _servings(calls) == named


def test_a_served_again_id_fits_the_stores_request_ids() -> None:
    from specscope.event_checks import MAX_REQUEST_ID

    long_id = "r" * MAX_REQUEST_ID
    second = _servings([("start", long_id), ("finish", long_id), ("start", long_id)])[-1]
    assert len(second) == MAX_REQUEST_ID and second.endswith("#2")


def test_a_request_started_again_under_way_keeps_its_steps(store: Store) -> None:
    """Its verify steps go on from where they were: numbered from 0 again, the store dropped them."""
    sink = ListSink()
    with _tracer(sink) as tracer:
        tracer.start_request("q", 5)
        for accepted in (2, 2, 0):
            tracer.record_verify("q", 2, accepted)
            if accepted == 2:
                tracer.start_request("q", 5)
        tracer.finish_request("q", 6)
    store.write(sink.events)
    assert store.query("SELECT step, accepted FROM verify_steps ORDER BY step").rows == [(0, 2), (1, 2), (2, 0)]

def test_second_request_end_keeps_the_first(store: Store) -> None:
    """At the store, too: a second RequestEnd of a request (any producer) changes nothing."""
    store.write([_start("q"), ev.RequestEnd(run_id=RUN, request_id="q", rank=0, output_tokens=5,
                                            verify_steps=2, text="first", ts_wall=1.0)])
    store.write([ev.RequestEnd(run_id=RUN, request_id="q", rank=0, output_tokens=9, verify_steps=7,
                               text="second", ts_wall=2.0)])
    assert store.query("SELECT output_tokens, text FROM requests").rows == [(5, "first")]


@pytest.mark.parametrize("fields", [
    dict(emitted=(1, 2)),  # token ids, not decoded text
    dict(emitted=("a", "b", "c")),  # more than accepted + 1
    dict(emitted=["a", "b"]),  # not a tuple
])
def test_verify_step_refuses_bad_emitted(fields: dict) -> None:
    with pytest.raises(InvalidEvent, match="emitted"):
        _step(0, **fields)


@pytest.mark.parametrize("fields", [dict(prompt_tokens=-1), dict(prompt_tokens=math.nan),
                                    dict(prompt_tokens=None)])
def test_request_start_refuses_bad_counts(fields: dict) -> None:
    with pytest.raises(InvalidEvent, match="prompt_tokens"):
        _start("q", **fields)


def _load_report(**fields) -> ev.LoadReport:
    return ev.LoadReport(**{"run_id": "run", "rank": 0, "module": "draft", "source": "/m", "strict": False,
                            "loaded": 3, "missing": ("fc.weight",), "renamed": (("a.w", "b.w"),)} | fields)


# Values the doctor reads as checkpoint keys: stored as given, one of them failed the doctor for every
# run of the store, the dashboard's first page and the exporter's findings (an attack trial).
@pytest.mark.parametrize("fields, named", [
    (dict(missing=(1, 2)), "missing"), (dict(missing=3), "missing"), (dict(unexpected=[None]), "unexpected"),
    (dict(unexpected={"k": 1}), "unexpected"), (dict(renamed=(("a",),)), "renamed"),
    (dict(renamed=(("a", 1),)), "renamed"), (dict(loaded=-1), "loaded"), (dict(loaded="3"), "loaded"),
    (dict(strict="yes"), "strict"), (dict(module=None), "module"),
])
def test_load_report_refuses_what_is_not_keys(fields: dict, named: str) -> None:
    with pytest.raises(InvalidEvent, match=named) as info:
        _load_report(**fields)
    assert "\n" not in str(info.value)


def test_load_report_takes_lists_of_keys() -> None:
    """Lists, as a loader returns them, are keys too."""
    report = _load_report(missing=["fc.weight"], unexpected=[], renamed=[["a.w", "b.w"]])
    assert report.missing == ["fc.weight"]


@pytest.mark.parametrize("fields, named", [
    (dict(hook_errors="x"), "hook_errors"), (dict(hook_calls=-1), "hook_calls"),
    (dict(hook_calls=2**31), "counts go up to"), (dict(finished="no"), "finished"),
    (dict(graph_mode=1), "graph_mode"), (dict(error=5), "error"),
])
def test_rank_status_refuses_what_is_not_its_counters(fields: dict, named: str) -> None:
    with pytest.raises(InvalidEvent, match=named):
        ev.RankStatus(**{"run_id": "run", "rank": 0, "hook_calls": 1, "hook_errors": 0} | fields)



# Values every reading of a finding trusts: a severity outside SEVERITIES failed the doctor's sort and
# compare with a traceback, evidence that is not a dict its settling of checkpoint findings (an attack trial).
@pytest.mark.parametrize("fields, named", [
    (dict(severity="fatal"), "severity"), (dict(severity=None), "severity"), (dict(source="ci"), "source"),
    (dict(evidence=["x"]), "evidence"), (dict(evidence={1: "x"}), "evidence"), (dict(code=7), "code"),
    (dict(message=None), "message"), (dict(run_id=3), "run_id"),
    (dict(evidence={"as_inspected": {"severity": "error"}}), "as_inspected"),
    (dict(evidence={"as_inspected": "error"}), "as_inspected"),
])
def test_finding_refuses_what_its_readers_cannot_read(fields: dict, named: str) -> None:
    with pytest.raises(InvalidEvent, match=named) as info:
        ev.Finding(**{"code": "ROPE_MISMATCH", "severity": "warning", "message": "m", "evidence": {}, "fix": "f",
                      "run_id": "run", "source": "inspect"} | fields)
    assert "\n" not in str(info.value)


def test_finding_takes_a_settled_inspection() -> None:
    evidence = {"as_inspected": {"severity": "warning", "message": "rope differs"}, "verified_by_provenance": 3}
    assert ev.Finding("ROPE_MISMATCH", "info", "m", evidence, "f", run_id="run", source="inspect").evidence == evidence

def test_requests_page_rows_tolerate_token_ids(tmp_path: Path) -> None:
    """A store written before the check, holding token ids as ``emitted``: the Requests page's token
    rows are text (they broke the page with a traceback)."""
    from specscope.app.queries import marked_tokens, request_steps

    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        store.write([_start("q1"), _step(1)])
    with sqlite3.connect(path) as conn:  # what an older specscope let through
        conn.execute("UPDATE verify_steps SET emitted = '[464, 1337]'")
    with open_store(path, read_only=True) as store:
        tokens = marked_tokens(request_steps(store, RUN, "q1"))
    assert [t["token"] for t in tokens] == ["464", "1337"]
