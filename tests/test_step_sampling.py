"""Volume control: per-step rows for a sampled share of requests, exact aggregates for every request.

The same verify steps are traced twice through a real Tracer and Collector into one store, once with
step detail for every request and once with ``step_sample=0.25``: every acceptance view and every
doctor verdict must be the same, while the sampled run keeps per-step rows for some requests only.
"""

from __future__ import annotations

import random

import pytest

from specscope import Collector, RunConfig, Tracer
from specscope.doctor import diagnose
from specscope.errors import ConfigError
from specscope.storage import open_store

K = 4
CONFIG = RunConfig(aux_layer_ids_resolved=(2, 15, 27), target_hidden_size=576, expected_fused_width=1728,
                   k=K, num_target_layers=30)
REQUESTS = 24
STEPS = 12

# accepted drafts per verify step drawn from each scenario's distribution (a chain of K drafts)
SCENARIOS = {
    "healthy": [0, 1, 1, 2, 2, 3, 4],
    "collapse": [0] * 40 + [1],
    "position0-low": [0] * 8 + [4, 4, 4],
    "saturated": [K],
}

VIEWS = {
    "v_run_acceptance": "SELECT verify_steps, proposed, accepted, mean_acceptance_length, acceptance_rate "
                        "FROM v_run_acceptance WHERE run_id = :r",
    "v_rank_acceptance": "SELECT rank, verify_steps, proposed, accepted, mean_acceptance_length "
                         "FROM v_rank_acceptance WHERE run_id = :r ORDER BY rank",
    "v_position_acceptance": "SELECT position, accepted_steps, verify_steps, acceptance "
                             "FROM v_position_acceptance WHERE run_id = :r ORDER BY position",
    "v_request_acceptance": "SELECT request_id, verify_steps, proposed, accepted, mean_acceptance_length "
                            "FROM v_request_acceptance WHERE run_id = :r ORDER BY request_id",
    "v_request_position_acceptance": "SELECT request_id, position, accepted_steps, verify_steps "
                                     "FROM v_request_position_acceptance WHERE run_id = :r "
                                     "ORDER BY request_id, position",
}


def _trace(store, run_id: str, accepted_by_rank: dict[int, list[int]], step_sample: float) -> None:
    """Two ranks of one run; rank r serves requests r, r+2, ...; each request STEPS verify steps."""
    with Collector(store, flush_interval_s=0.05) as collector:
        tracers = {}
        for rank in accepted_by_rank:
            tracers[rank] = Tracer(collector, run_id=run_id, engine="sampled", engine_version="0",
                                   target_model="t", draft_model="d", config=CONFIG,
                                   step_sample=step_sample, rank=rank,
                                   world_size=len(accepted_by_rank))  # two ranks in one process
        for index in range(REQUESTS):
            rank = index % len(tracers)
            tracer, request_id = tracers[rank], f"req-{index:02d}"
            tracer.start_request(request_id, prompt_tokens=10)
            for step in range(STEPS):
                accepted = accepted_by_rank[rank][index * STEPS + step]
                tracer.record_verify(request_id, proposed=K, accepted=accepted)
            tracer.finish_request(request_id, output_tokens=STEPS * 2)
        for tracer in tracers.values():
            tracer.close()


def _views(store, run_id: str) -> dict[str, list[tuple]]:
    return {name: store.query(sql.replace(":r", f"'{run_id}'"))[1] for name, sql in VIEWS.items()}


@pytest.mark.parametrize("scenario", [*SCENARIOS, "rank-divergence"])
def test_sampled_runs_keep_exact_aggregates_and_doctor_verdicts(tmp_path, scenario: str) -> None:
    rng = random.Random(7)
    n = REQUESTS * STEPS
    if scenario == "rank-divergence":  # rank 0 healthy, rank 1 nearly collapsed
        accepted = {0: [rng.choice(SCENARIOS["healthy"]) for _ in range(n)],
                    1: [rng.choice([0, 0, 0, 1]) for _ in range(n)]}
    else:
        draws = [rng.choice(SCENARIOS[scenario]) for _ in range(n)]
        accepted = {0: draws, 1: draws}
    with open_store(str(tmp_path / "s.db")) as store:
        _trace(store, "full", accepted, step_sample=1.0)
        _trace(store, "sampled", accepted, step_sample=0.25)
        full, sampled = _views(store, "full"), _views(store, "sampled")
        for name in VIEWS:
            assert sampled[name] == full[name], name
        assert full["v_run_acceptance"][0][0] == n
        detail = dict(store.query("SELECT request_id, step_detail FROM v_request_acceptance "
                                  "WHERE run_id = 'sampled'")[1])
        assert 0 < sum(detail.values()) < REQUESTS  # some requests kept step detail, not all
        kept_rows = store.query("SELECT COUNT(*) FROM verify_steps WHERE run_id = 'sampled' AND step >= 0")[1]
        assert kept_rows[0][0] == sum(detail.values()) * STEPS
        config = store.query("SELECT config FROM runs WHERE run_id = 'sampled'")[1][0][0]
        assert '"step_sample":0.25' in config
        codes_full = sorted(diagnose(store, "full").codes())
        codes_sampled = sorted(diagnose(store, "sampled").codes())
    assert codes_sampled == codes_full
    expected = {"healthy": None, "collapse": "ACCEPT_COLLAPSE", "position0-low": "POSITION0_LOW",
                "saturated": "ACCEPT_SATURATED", "rank-divergence": "RANK_DIVERGENCE"}[scenario]
    accept_codes = {"ACCEPT_COLLAPSE", "POSITION0_LOW", "ACCEPT_SATURATED", "RANK_DIVERGENCE"}
    assert sorted(set(codes_full) & accept_codes) == ([] if expected is None else [expected])


def test_step_sample_out_of_range_is_a_config_error(tmp_path) -> None:
    with open_store(str(tmp_path / "s.db")) as store, Collector(store) as collector:
        with pytest.raises(ConfigError, match="step_sample"):
            Tracer(collector, engine="e", engine_version="0", target_model="t", draft_model="d",
                   config=CONFIG, step_sample=1.5)


def test_requests_page_says_which_requests_have_step_detail(tmp_path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from specscope.app import DB_ENV, ENTRY

    db = str(tmp_path / "s.db")
    with open_store(db) as store:
        _trace(store, "sampled", {0: [1] * (REQUESTS * STEPS)}, step_sample=0.25)
        detail = dict(store.query("SELECT request_id, step_detail FROM v_request_acceptance")[1])
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    at.switch_page("screens/requests.py").run()
    table = at.dataframe[0].value
    assert dict(zip(table["request"], table["step detail"])) == {r: bool(d) for r, d in detail.items()}
    without = next(r for r, d in detail.items() if not d)
    at.selectbox(key="request").set_value(without).run()
    assert not at.exception
    assert any("has no step detail" in i.value for i in at.info)
