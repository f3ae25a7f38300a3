"""The demo's options: a fault on one rank only, run ids of a Tracer's length, bad options (a --k
the store cannot record, a dashboard port taken) refused as one line with exit 2 before any engine
runs, and each run's serving line naming its sampling (two short runs, the only tests here that
run an engine)."""

from __future__ import annotations

import socket

import pytest

from specscope.adapters.reference import DemoOptions
from specscope.cli import main
from specscope.cli.demo import VLLM_CRASHES, stopped
from specscope.engine.faults import parse_rank_fault
from specscope.engine.vllm_run import VLLM_FAULTS
from specscope.errors import ConfigError
from specscope.storage import open_store


def test_rank_fault_applies_to_its_rank_only():
    opts = DemoOptions(db="x.db", ranks=2, requests=4, rank_fault=parse_rank_fault("1:no-aux-capture"))
    opts.check()
    assert [opts.fault_for(rank) for rank in (0, 1)] == [None, "no-aux-capture"]
    assert opts.label == "rank 1: no-aux-capture"
    both = DemoOptions(db="x.db", ranks=2, requests=2, fault="d2t-absolute", rank_fault=(0, "aux-off-by-one"))
    assert [both.fault_for(rank) for rank in (0, 1)] == ["aux-off-by-one", "d2t-absolute"]


@pytest.mark.parametrize("text, message", [("1", "not RANK:NAME"), ("a:no-aux-capture", "not RANK:NAME"),
                                           ("1:nope", "unknown fault 'nope'")])
def test_bad_rank_fault_text(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_rank_fault(text)


def test_rank_fault_outside_the_ranks_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="ranks 0..1"):
        DemoOptions(db="x.db", ranks=2, requests=2, rank_fault=(2, "no-aux-capture")).check()
    assert main(["demo", "--no-dashboard", "--db", str(tmp_path / "d.db"), "--rank-fault", "3:no-aux-capture"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "d.db").exists()


def test_demo_run_ids_have_a_tracers_length():
    assert len(DemoOptions(db="x.db").run_id) == 32  # Tracer: uuid4().hex


def test_a_vllm_crash_the_fault_causes_is_announced_as_expected():
    error = "ValueError: too many values to unpack (expected 2)"
    line = stopped("no-aux-capture", error)
    assert "as the no-aux-capture fault makes it" in line and line.endswith(error)
    assert "unexpectedly" in stopped(None, error) and "unexpectedly" in stopped("tied-target", error)
    assert set(VLLM_CRASHES) <= set(VLLM_FAULTS)


@pytest.mark.parametrize("k", ["65", "0", "-1"])
def test_k_outside_what_a_store_records_is_refused(k, tmp_path, capsys):
    """The store keeps per-position figures for 64 draft positions: --k 65 ran, stored no verify
    step and exited 0."""
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--no-dashboard", "--db", str(tmp_path / "d.db"), f"--k={k}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and f"argument --k: '{k}' is not an integer in 1..64" in err
    assert not (tmp_path / "d.db").exists()


@pytest.mark.parametrize("engine", ["reference", "vllm", "llama.cpp"])
@pytest.mark.parametrize("requests", ["99999999999999999999", "100001", "0", "-1"])
def test_a_request_count_out_of_range_is_one_line(engine, requests, tmp_path, capsys):
    """--requests 99999999999999999999 printed an OverflowError's traceback (found by an attack trial)."""
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--engine", engine, "--no-dashboard", "--db", str(tmp_path / "d.db"), f"--requests={requests}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert f"argument --requests: '{requests}' is not an integer in 1..100000" in err
    assert not (tmp_path / "d.db").exists()


@pytest.mark.parametrize("options, message", [
    (["--engine", "vllm", "--fault", "unrenamed-keys"], "unrenamed-keys"),
    (["--engine", "vllm", "--rank-fault", "0:no-aux-capture"], "serves one rank"),
    (["--engine", "llama.cpp", "--fault", "no-aux-capture"], "without fault switches"),
])
def test_options_an_engine_refuses_create_no_store(options, message, tmp_path, capsys):
    """They were refused once the store had been created: an empty store was left behind."""
    assert main(["demo", "--no-dashboard", "--db", str(tmp_path / "d.db"), *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "d.db").exists()


@pytest.mark.parametrize("engine", ["reference", "llama.cpp"])
def test_a_taken_dashboard_port_fails_before_any_run(engine, tmp_path, capsys):
    """It served all three runs and only then failed to serve the dashboard."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        code = main(["demo", "--engine", engine, "--db", str(tmp_path / "d.db"), "--port", str(taken.getsockname()[1])])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "choose another --port" in err
    assert not (tmp_path / "d.db").exists()


@pytest.mark.parametrize("engine, sampling", [
    ("reference", "greedy"), ("llama.cpp", "T=1 top_p=0.95 top_k=40 min_p=0.05 seed=1"),
])
def test_each_serving_line_names_the_sampling_the_run_stored(engine, sampling, tmp_path, capsys):
    """llama.cpp's runs sample at T=1 (its acceptance is not a greedy run's): the serving line says so,
    and says what the requests were recorded with."""
    db = str(tmp_path / "d.db")
    main(["demo", "--engine", engine, "--no-dashboard", "--requests", "1", "--max-new-tokens", "4", "--db", db])
    serving = [line for line in capsys.readouterr().out.splitlines() if line.startswith("specscope demo: serving")]
    assert serving and all(f", sampling {sampling} -> {db}" in line for line in serving), serving
    with open_store(db, read_only=True) as store:
        stored = {row[0] for row in store.query("SELECT DISTINCT temperature FROM requests")[1]}
    assert stored == {0.0 if sampling == "greedy" else 1.0}
