"""`specscope exporter`: the store as a Prometheus target, scraped by a REAL Prometheus (Debian's
package) on loopback that loads the shipped alert rules; the Grafana dashboard's queries checked
against the exported names."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import _traces
import httpx
import pytest
import sqlalchemy as sa
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specscope import events as ev
from specscope.adapters.prometheus_metrics import CONVENTIONS
from specscope.cli import main
from specscope.events import LosslessAudit
from specscope.exporter import serve_exporter
from specscope.storage import open_store

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/specscope.json"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")


@pytest.fixture
def exporter(tmp_path):
    """An exporter over a store with a healthy run and a no-aux-capture run (AUX_NOT_FUSED,
    ACCEPT_COLLAPSE, and an audit that caught greedy tokens off the target's argmax:
    LOSSLESS_VIOLATION), on a free loopback port. Yields ``(url, registry)``."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.healthy().write(store)
        _traces.no_aux_capture().write(store)
        store.write([LosslessAudit("no-aux", 0, "no-aux-r0", "greedy", tokens=8, mismatches=3)])
    with open_store(path, create=False, read_only=True) as store:
        server, _, registry = serve_exporter(store, port=0)
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/metrics", registry
        finally:
            server.shutdown()
            server.server_close()


def _samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _value(samples: dict[tuple, float], name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_exported_values_are_the_views(exporter) -> None:
    url, _ = exporter
    samples = _samples(httpx.get(url).text)
    assert _value(samples, "specscope_finding", code="AUX_NOT_FUSED", run_id="no-aux") == 1
    assert _value(samples, "specscope_finding", code="ACCEPT_COLLAPSE", run_id="no-aux", severity="error") == 1
    healthy = [dict(k[1]) for k in samples if k[0] == "specscope_finding" and ("run_id", "healthy") in k[1]]
    assert [(f["code"], f["severity"]) for f in healthy] == [("LOSSLESS_AUDITED", "info")]  # its audit, no fault
    fed = dict(run_id="no-aux", rank="0", hook_point="draft.forward:hidden_states", expected_width="1728")
    assert _value(samples, "specscope_draft_input_width", **fed) == 576
    assert _value(samples, "specscope_draft_input_expected_width", **fed) == 1728
    assert _value(samples, "specscope_draft_input_width_mismatch_calls", **fed) > 0
    assert _value(samples, "specscope_mean_acceptance_length", run_id="healthy", rank="all") == pytest.approx(2.0)
    assert _value(samples, "specscope_mean_acceptance_length", run_id="no-aux", rank="0") == pytest.approx(1.0)
    assert _value(samples, "specscope_position_acceptance", run_id="healthy", position="0") == pytest.approx(0.75)
    assert _value(samples, "specscope_verify_steps_total", run_id="healthy", rank="all") == 32
    assert _value(samples, "specscope_events_dropped_total", run_id="healthy", rank="0") == 0
    assert _value(samples, "specscope_run_running", run_id="healthy",
                  model_name="HuggingFaceTB/SmolLM2-135M-Instruct") == 0


def test_a_finding_carries_the_ranks_it_names(tmp_path) -> None:
    """Rank 1 of two never captures: its contract findings and the acceptance divergence carry
    rank="1" (the doctor's evidence), a dropped-keys load its rank, a run-wide finding rank="all"."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.two_ranks_diverging().write(store)
        _traces.dropped_keys().write(store)
        _traces.few_steps().write(store)
    with open_store(path, create=False, read_only=True) as store:
        server, _, _ = serve_exporter(store, port=0)
        try:
            samples = _samples(httpx.get(f"http://127.0.0.1:{server.server_address[1]}/metrics").text)
        finally:
            server.shutdown()
            server.server_close()
    ranks = {}
    for name, labels in samples:
        labels = dict(labels)
        if name == "specscope_finding":
            ranks.setdefault((labels["run_id"], labels["code"]), []).append(labels["rank"])
    assert ranks[("two-ranks", "AUX_NOT_FUSED")] == ["1"]
    assert ranks[("two-ranks", "AUX_CAPTURE_SILENT")] == ["1"]
    # by acceptance: the low rank; by width: the ranks differ, none is named the culprit
    assert sorted(ranks[("two-ranks", "RANK_DIVERGENCE")]) == ["1", "all"]
    assert ranks[("dropped-keys", "WEIGHTS_DROPPED")] == ["0"]
    assert ranks[("few-steps", "CHECKS_SKIPPED")] == ["all"]


def test_exporter_cli_refuses_a_missing_store(tmp_path, capsys) -> None:
    assert main(["exporter", "--db", str(tmp_path / "none.db"), "--port", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]
    return exprs


def _concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced as Grafana would for "All"; a
    variable's ``label_values(METRIC, label)`` becomes the series query Grafana runs for it."""
    expr = re.sub(r"^label_values\((.+),\s*\w+\)$", r"\1", expr)
    return (expr.replace("$__rate_interval", "1m").replace('"$run_id"', '".*"')
            .replace('"$model_name"', '".*"'))


def test_grafana_dashboard_queries_use_exported_names(exporter) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "specscope-fleet"  # stable: re-imports replace the same dashboard
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all({"x", "y", "w", "h"} <= set(p["gridPos"]) for p in dashboard["panels"])
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "run_id", "model_name"}
    exported = {s.name for f in text_string_to_metric_families(generate_latest(exporter[1]).decode())
                for s in f.samples}
    vllm = {name + "_total" for conv in CONVENTIONS if conv.engine == "vllm" for name in conv.metrics.values()}
    used = set()
    for expr in _expressions():
        used |= set(re.findall(r"\b(?:specscope_\w+|vllm:[\w:]+)", expr))
    specscope_names = {n for n in used if n.startswith("specscope_")}
    assert specscope_names and specscope_names <= exported, specscope_names - exported
    assert {n for n in used if n.startswith("vllm:")} <= vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, probe, timeout_s: float = 90.0):
    """Poll ``probe`` until it returns something truthy (a real server's scrape / rule cycle)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(0.5)
    pytest.fail(f"Prometheus never showed {what} within {timeout_s:.0f}s")


@pytest.mark.prometheus
@pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason="no prometheus / promtool (make prometheus)")
def test_real_prometheus_scrapes_the_exporter_and_fires_the_alerts(exporter, tmp_path) -> None:
    check = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    rules = yaml.safe_load(ALERTS.read_text())
    paging = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if r["labels"]["severity"] == "page"}
    assert {r["for"] for r in paging.values()} == {"2m"}
    for rule in paging.values():  # the test copy: same expressions, a short `for`
        rule["for"] = "2s"
    fast_rules = tmp_path / "alerts.yml"
    fast_rules.write_text(yaml.safe_dump(rules))
    url, _ = exporter
    target = url.split("//")[1].split("/")[0]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(fast_rules)],
        "scrape_configs": [{"job_name": "specscope", "static_configs": [{"targets": [target]}]}]}))
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def query(expr: str) -> list:
            try:
                body = httpx.get(f"{api}/query", params={"query": expr}, timeout=5).json()
            except (httpx.HTTPError, ValueError):  # not up yet: refused, or a starting server's non-JSON answer
                return []
            assert body["status"] == "success", body
            return body["data"]["result"]

        result = _wait("the exported AL", lambda: query(
            'specscope_mean_acceptance_length{run_id="healthy",rank="all"}'))
        assert float(result[0]["value"][1]) == pytest.approx(2.0)
        for expr in _expressions():  # every dashboard query is valid PromQL on a real server
            query(_concrete(expr))

        def firing() -> set:
            try:
                alerts = httpx.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
            except (httpx.HTTPError, ValueError):
                return set()
            found = {(a["labels"]["alertname"], a["labels"]["run_id"]) for a in alerts if a["state"] == "firing"}
            return found if {name for name, _ in found} >= set(paging) else set()

        assert _wait("both paging alerts firing", firing) == {(name, "no-aux") for name in paging}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_exporter_cli_serves_until_stopped(tmp_path, stop) -> None:
    """Served until a service manager's SIGTERM or Ctrl-C's SIGINT: then exit 0, nothing on stderr,
    the port freed."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.no_aux_capture().write(store)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "specscope", "exporter", "--db", path, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().split()[-1]
        samples = _samples(httpx.get(url, timeout=30).text)
        assert _value(samples, "specscope_finding", code="AUX_NOT_FUSED") == 1
        assert _value(samples, "specscope_run_findings", run_id="no-aux", severity="error") >= 2
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, err) == (0, "")
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=5)


def _scrape(path: str, **settings) -> httpx.Response:
    """One scrape of an exporter over the store at ``path``. Unless a test sets ``timeout_s``, each read
    may take up to :data:`HANG_S`: these tests check what a scrape says, not how fast (a CI worker
    beside a vLLM run took a findings read past the 1.2 s default, and the scrape rightly left the
    findings out)."""
    settings.setdefault("timeout_s", HANG_S)
    with open_store(path, create=False, read_only=True) as store:
        server, _, _ = serve_exporter(store, port=0, **settings)
        try:
            return httpx.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=HANG_S)
        finally:
            server.shutdown()
            server.server_close()


HANG_S = 120.0  # a scrape still unanswered after this long hangs (a detector, not a timing check)


def test_two_violations_of_one_run_are_two_series(tmp_path) -> None:
    """A greedy and a T=0.8 group both failing the audit: two LOSSLESS_VIOLATION findings, so two
    series, as specscope_run_findings counts them."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.no_aux_capture().write(store)
        store.write([LosslessAudit("no-aux", 0, "no-aux-r0", "greedy", tokens=8, mismatches=3),
                     LosslessAudit("no-aux", 0, "no-aux-r1", "T=0.8", tokens=5000, rare=400, rare_expected=5.0,
                                   epsilon=1e-3, p_sum=1000.0, p2_sum=500.0)])
    samples = _samples(_scrape(path).text)
    series = [dict(ls) for n, ls in samples if n == "specscope_finding" and ("code", "LOSSLESS_VIOLATION") in ls]
    assert sorted(s["sampling"] for s in series) == ["T=0.8", "greedy"]
    errors = {(labels["code"], labels["sampling"]) for labels in map(dict, (ls for n, ls in samples if n == "specscope_finding"))
              if labels["run_id"] == "no-aux" and labels["severity"] == "error"}  # a finding on 2 ranks counts once
    assert len(errors) == _value(samples, "specscope_run_findings", run_id="no-aux", severity="error") == 5


def test_a_bytes_run_id_the_collector_once_stored_is_exported(tmp_path) -> None:
    """A store written before writes refused it keeps a bytes run id as a BLOB (the collector let one
    through before it checked, and Store.write until later): its labels are text, the scrape answers
    200 with every run."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.healthy().write(store)
        store.write([ev.RunStart("bytes-run", "e", "0", "t", "d", {}), ev.RankStart("bytes-run", 0, 1, "h", 1, "cpu"),
                     ev.VerifyStep("bytes-run", "q", 0, 0, 2, 1)])
    with sqlite3.connect(path) as conn:  # as such a store holds it
        for table in ("runs", "run_ranks", "verify_steps", "acceptance_masks", "request_accepts", "step_seconds"):
            conn.execute(f"UPDATE {table} SET run_id = CAST(run_id AS BLOB) WHERE run_id = 'bytes-run'")
        assert conn.execute("SELECT typeof(run_id) FROM runs WHERE run_id = CAST('bytes-run' AS BLOB)").fetchall() == [("blob",)]
    conn.close()
    response = _scrape(path)
    assert response.status_code == 200
    samples = _samples(response.text)
    assert _value(samples, "specscope_run_running", run_id="bytes-run") == 1
    assert _value(samples, "specscope_mean_acceptance_length", run_id="healthy", rank="all") == pytest.approx(2.0)


def _corrupt_table(path: str, table: str) -> None:
    """Overwrite the root page of ``table`` with garbage (the schema stays readable)."""
    with sqlite3.connect(path) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


def test_a_corrupt_page_costs_only_what_reads_it(tmp_path) -> None:
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.healthy().write(store)
    _corrupt_table(path, "tensor_shapes")
    response = _scrape(path)
    assert response.status_code == 200
    samples = _samples(response.text)
    assert _value(samples, "specscope_exporter_read_errors", part="contract") == 1
    assert _value(samples, "specscope_mean_acceptance_length", run_id="healthy", rank="all") == pytest.approx(2.0)


_ENDLESS = """CREATE VIEW v_position_acceptance AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
SELECT CAST('healthy' AS TEXT) AS run_id, 0 AS position, 0.5 AS acceptance FROM n WHERE i < 0"""


def test_an_endless_view_is_cut_at_the_time_limit(store_url: str) -> None:
    """A view replaced by a recursive one that never ends: that read stops at the time limit, the
    scrape answers with the rest."""
    with open_store(store_url) as store:
        _traces.healthy().write(store)
    if store_url.startswith("postgresql"):
        engine = sa.create_engine(store_url)
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP VIEW v_position_acceptance CASCADE")
            conn.exec_driver_sql(_ENDLESS)
        engine.dispose()
    else:
        with sqlite3.connect(store_url) as conn:
            conn.executescript(f"DROP VIEW v_position_acceptance; {_ENDLESS};")
        conn.close()
    response = _scrape(store_url, timeout_s=0.5)
    assert response.status_code == 200
    samples = _samples(response.text)
    assert _value(samples, "specscope_exporter_read_errors", part="positions") == 1
    assert _value(samples, "specscope_verify_steps_total", run_id="healthy", rank="all") == 32


def test_a_replay_stored_after_a_scrape_is_exported_at_the_next(tmp_path) -> None:
    """The exporter reads an ended run's verdict once, and again after ``specscope replay`` stored
    results for it: the replay's finding is a series from the next scrape on."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.healthy().write(store)
    with open_store(path, create=False, read_only=True) as store:
        server, _, _ = serve_exporter(store, port=0)
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        try:
            before = _samples(httpx.get(url).text)
            with open_store(path) as writer:
                audit = LosslessAudit("healthy", 0, "req-0", "greedy", 24)
                writer.write([ev.ReplayResult("healthy", "req-0", "folder", 0.25, audit, departures=1,
                                              near_ties=1, first_departure=4, first_margin=0.01, max_margin=0.01)])
            after = _samples(httpx.get(url).text)
        finally:
            server.shutdown()
            server.server_close()
    assert not [k for k in before if k[0] == "specscope_finding" and ("code", "REPLAY_DIVERGENCE") in k[1]]
    assert _value(after, "specscope_finding", code="REPLAY_DIVERGENCE", run_id="healthy", severity="warning") == 1


def test_per_request_acceptance_length_is_a_histogram(tmp_path) -> None:
    """Requests of AL 1.0, 2.0, 2.0 and 5.0 (k = 4): cumulative buckets, their sum and count."""
    from _acceptance_runs import Req, write_run
    from prometheus_client import CollectorRegistry

    from specscope.exporter import StoreCollector

    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        write_run(store, "spread", [Req([0] * 8), Req([1] * 8), Req([2, 0] * 4), Req([4] * 8)])
    with open_store(path, create=False, read_only=True) as store:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(store))
        samples = _samples(generate_latest(registry).decode())
    name = "specscope_request_acceptance_length"
    assert _value(samples, f"{name}_bucket", run_id="spread", le="1.0") == 1
    assert _value(samples, f"{name}_bucket", run_id="spread", le="1.75") == 1
    assert _value(samples, f"{name}_bucket", run_id="spread", le="2.0") == 3
    assert _value(samples, f"{name}_bucket", run_id="spread", le="4.0") == 3
    assert _value(samples, f"{name}_bucket", run_id="spread", le="+Inf") == 4
    assert _value(samples, f"{name}_count", run_id="spread") == 4
    assert _value(samples, f"{name}_sum", run_id="spread") == pytest.approx(10.0)
