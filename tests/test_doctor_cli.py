"""`specscope doctor --db URL [--run ID] [--json]`: output, JSON schema and exit status 0 / 1 / 2."""

from __future__ import annotations

import json
from pathlib import Path

import _traces as T
import pytest

from specscope.cli import main
from specscope.storage import open_store


@pytest.fixture
def db(store_url) -> str:
    with open_store(store_url) as store:
        T.healthy().write(store)
        T.no_aux_capture().write(store)
    return store_url


def doctor(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["doctor", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_json_matches_the_design_schema(db, capsys):
    status, out, _ = doctor(capsys, "--db", db, "--json")
    data = json.loads(out)
    assert status == 1
    assert set(data) == {"runs", "findings"}
    for run in data["runs"]:
        assert set(run) == {"run_id", "engine", "fault", "requests", "verify_steps",
                            "mean_acceptance_length", "acceptance_rate", "per_position_acceptance",
                            "sampling", "lossless_audit", "what_if_k", "acceptance_histogram",
                            "request_acceptance", "acceptance_windows", "acceptance_by_output_position"}
    assert {r["run_id"] for r in data["runs"]} == {"healthy", "no-aux"}
    assert [f["code"] for f in data["findings"]] == ["AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "ACCEPT_COLLAPSE",
                                                     "LOSSLESS_AUDITED", "LOSSLESS_AUDITED"]
    fused = data["findings"][0]
    assert set(fused) == {"code", "severity", "message", "evidence", "fix", "run_id"}
    assert (fused["run_id"], fused["evidence"]["observed_width"], fused["evidence"]["expected_width"]) == (
        "no-aux", 576, 1728)


def test_exit_status_per_run(db, capsys):
    status, out, _ = doctor(capsys, "--db", db, "--run", "healthy")
    assert status == 0
    assert out.splitlines()[:2] == [
        "run healthy [specscope-reference]: 4 request(s), 32 verify step(s), AL 2.00, rate 25.0%, "
        "p_i 0.75 0.25 0.00 0.00", "0 error(s), 0 warning(s), 1 info"]
    assert "LOSSLESS_AUDITED [run healthy]: output audited against the target: 64 tokens" in out
    status, out, _ = doctor(capsys, "--db", db, "--run", "no-aux")
    assert status == 1 and "ERROR   AUX_NOT_FUSED [run no-aux]" in out


def test_a_whole_store_report_gives_each_run_its_own_verdict(db, capsys):
    status, out, _ = doctor(capsys, "--db", db)
    runs = {line.split()[1]: line for line in out.splitlines() if line.startswith("run ")}
    assert status == 1 and set(runs) == {"healthy", "no-aux"}
    assert runs["healthy"].endswith("-> 0 error(s), 0 warning(s), 1 info")
    assert runs["no-aux"].endswith("-> 3 error(s), 0 warning(s), 1 info")
    assert "3 error(s), 0 warning(s), 2 info" in out.splitlines()  # the store's totals


def test_unknown_run_is_bad_input(db, capsys):
    status, out, err = doctor(capsys, "--db", db, "--run", "missing")
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and "no run 'missing'" in err and "no-aux" in err


def test_an_empty_run_id_is_bad_input_not_the_only_run(tmp_path, capsys):
    path = str(tmp_path / "one.db")
    with open_store(path) as store:
        T.no_aux_capture().write(store)
    status, out, err = doctor(capsys, "--db", path, "--run", "")
    assert (status, out) == (2, "") and err.count("\n") == 1 and "an empty run id" in err and "no-aux" in err


def test_a_store_without_runs_is_bad_input_not_a_pass(tmp_path, capsys):
    """A store the engine never wrote to (a typo'd path the dashboard created): a `doctor || fail`
    gate must not pass on it."""
    path = str(tmp_path / "empty.db")
    open_store(path).close()
    for extra in ((), ("--json",)):
        status, out, err = doctor(capsys, "--db", path, *extra)
        assert (status, out) == (2, "") and err.count("\n") == 1 and "no runs in" in err


@pytest.mark.parametrize(("config", "problem"), [
    ({"aux_layer_ids_resolved": "2,15,27"}, "aux_layer_ids_resolved is '2,15,27', not a list of ints"),
    ({"aux_layer_ids_active": ["a"]}, "aux_layer_ids_active is ['a'], not a list of ints"),
    ({"expected_fused_width": "1728"}, "expected_fused_width is '1728', not an int"),
    ([2, 15, 27], "is list, not an object")])
def test_a_run_config_the_rules_cannot_read_is_bad_input_not_a_verdict(tmp_path, capsys, config, problem):
    """A config written around RunConfig (an adapter's dict) with a contract field of the wrong type:
    one line and exit 2, the doctor's and compare's (a traceback exited 1, which a CI gate reads as an
    error finding, or compare's regression)."""
    from specscope import events as ev

    path = str(tmp_path / "odd.db")
    with open_store(path) as store:
        for run_id in ("odd", "ok"):
            store.write([ev.RunStart(run_id=run_id, engine="e", engine_version="0", target_model="t", draft_model="d",
                                     config=config if run_id == "odd" else {}, ts_wall=1.0)]
                        + [e for r in ("a", "b") for e in (
                            ev.RequestStart(run_id, r, 0, prompt_tokens=3, temperature=0.0, prompt_key=r),
                            *(ev.VerifyStep(run_id, r, 0, step=i, proposed=4, accepted=2, ts_wall=2.0 + i)
                              for i in range(3)))])
    status, out, err = doctor(capsys, "--db", path, "--run", "odd")
    assert (status, out) == (2, "") and err == f"specscope doctor: error: run odd: runs.config {problem}\n"
    status = main(["compare", "--base-db", path, "--base-run", "ok", "--db", path, "--run", "odd"])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "") and err == f"specscope compare: error: run odd: runs.config {problem}\n"



@pytest.mark.parametrize(("severity", "evidence", "problem"), [
    ("fatal", "{}", "severity 'fatal' is not one of error, warning, info"),
    ("warning", '["x"]', "evidence ['x'] must be a dict with text keys"),
    ("warning", '{"as_inspected": {"severity": "error"}}', "evidence as_inspected {'severity': 'error'} must hold"),
])
def test_a_stored_finding_the_doctor_cannot_read_is_bad_input_not_a_verdict(store_url, capsys, severity,
                                                                            evidence, problem):
    """A checkpoint finding written around Store.write (raw SQL, an older writer): one line and exit 2 from
    doctor and compare (a traceback exited 1, which a CI gate reads as an error finding or a regression)."""
    import sqlalchemy as sa

    with open_store(store_url) as store:
        T.healthy().write(store)
        T.healthy("other").write(store)
    url = store_url if store_url.startswith("postgresql") else f"sqlite:///{store_url}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # around the Store on purpose
        conn.execute(sa.text("INSERT INTO findings (run_id, source, code, severity, message, evidence, fix, ts_wall) "
                             "VALUES ('healthy', 'inspect', 'ROPE_MISMATCH', :s, 'm', :e, 'f', 1.0)"),
                     {"s": severity, "e": evidence})
    engine.dispose()
    status, out, err = doctor(capsys, "--db", store_url, "--run", "healthy")
    assert (status, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith("specscope doctor: error: run healthy: malformed stored finding: finding ROPE_MISMATCH: ")
    assert problem in err
    status = main(["compare", "--base-db", store_url, "--base-run", "other", "--db", store_url, "--run", "healthy"])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "") and err.count("\n") == 1 and problem in err, err


def test_missing_store_is_bad_input(tmp_path, capsys):
    path = tmp_path / "absent.db"
    status, out, err = doctor(capsys, "--db", str(path), "--json")
    assert (status, out) == (2, "")
    assert err.startswith("specscope doctor: error: no specscope store") and not Path(path).exists()


def test_db_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["doctor"])
    assert exc.value.code == 2
