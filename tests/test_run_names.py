"""A run's names (run id, engine, engine version, fault label, host, device) must fit the store's
columns: PostgreSQL refuses a longer one, and with it the run's RunStart (the run would be stored
without it) while SQLite keeps it. They are refused where they are given, with one line."""

from __future__ import annotations

import pytest
from _draft_fixture import run_config
from _list_sink import ListSink

from specscope import events as ev
from specscope.adapters.recorder import ResponseRecorder
from specscope.errors import ConfigError, InvalidEvent
from specscope.event_checks import MAX_HOST, MAX_NAME
from specscope.instrumentation import Tracer

NAMES = dict(engine="e", engine_version="1", target_model="t", draft_model="d")


@pytest.mark.parametrize("field", ["run_id", "engine", "engine_version", "fault", "device"])
def test_the_tracer_refuses_a_name_no_store_holds(field):
    with pytest.raises(ConfigError, match=f"tracer: {field} .* is 65 characters; a store holds 64"):
        Tracer(ListSink(), config=run_config(), **{**NAMES, field: "x" * (MAX_NAME + 1)})


def test_names_that_fit_start_the_run_with_them(store):
    names = {**NAMES, "engine_version": "v" * MAX_NAME, "fault": "f" * MAX_NAME}
    sink = ListSink()
    tracer = Tracer(sink, config=run_config(), run_id="r" * MAX_NAME, device="cpu", **names)
    tracer.start()
    store.write(sink.events)
    (row,) = store.query("SELECT run_id, engine_version, fault FROM runs")[1]
    assert row == ("r" * MAX_NAME, "v" * MAX_NAME, "f" * MAX_NAME)
    tracer.close()


def test_the_run_start_refuses_them_too():
    with pytest.raises(InvalidEvent, match="run start: host .* is 256 characters; a store holds 255"):
        ev.RunStart("r", "e", "1", "t", "d", {}, host="h" * (MAX_HOST + 1))
    with pytest.raises(InvalidEvent, match="run start: fault"):
        ev.RunStart("r", "e", "1", "t", "d", {}, fault="f" * (MAX_NAME + 1))
    ev.RunStart("r" * MAX_NAME, "e" * MAX_NAME, "1", "t", "d", {}, host="h" * MAX_HOST)


def test_the_response_recorder_refuses_a_long_run_id():
    with pytest.raises(ConfigError, match="response recorder: run_id"):
        ResponseRecorder(ListSink(), run_id="x" * (MAX_NAME + 1))
