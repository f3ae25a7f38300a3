"""vLLM's model runner v2 without starting vLLM: which runner a config selects, that the run's config
records it, and that a run served on it (the scheduler's session alone, no worker attaches) is stored
and diagnosed RUNNER_NOT_ATTACHED with its acceptance intact."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from specscope.adapters.vllm import _session
from specscope.doctor import diagnose
from specscope.storage import open_store

HIDDEN, LAYERS = 64, 8


def _config(**runner) -> SimpleNamespace:
    """The parts of a ``VllmConfig`` the plugin reads (EAGLE-3, k = 3, the default capture layers)."""
    model = SimpleNamespace(get_hidden_size=lambda: HIDDEN, get_total_num_hidden_layers=lambda: LAYERS,
                            dtype="torch.bfloat16", model="target", served_model_name="target",
                            enforce_eager=False, tokenizer=None)
    spec = SimpleNamespace(method="eagle3", num_speculative_tokens=3, model="draft",
                           draft_model_config=SimpleNamespace(hf_config=SimpleNamespace()))
    parallel = SimpleNamespace(data_parallel_rank=0, data_parallel_size=1)
    return SimpleNamespace(model_config=model, speculative_config=spec, parallel_config=parallel,
                           compilation_config=SimpleNamespace(mode=3), **runner)


@pytest.mark.parametrize("chosen, env, runner", [
    (True, None, "v2"), (False, "1", "v1"),  # vLLM 0.32's own decision wins (its default may be v2)
    (None, "1", "v2"), (None, "0", "v1"), (None, None, "v1"),  # a vLLM without the property: the variable
])
def test_runner_follows_vllms_decision(monkeypatch, chosen, env, runner):
    if env is None:
        monkeypatch.delenv(_session.ENV_RUNNER_V2, raising=False)
    else:
        monkeypatch.setenv(_session.ENV_RUNNER_V2, env)
    config = _config() if chosen is None else _config(use_v2_model_runner=chosen)
    assert _session.model_runner(config) == runner
    assert _session.run_config(config).to_dict()["model_runner"] == runner


def test_a_runner_v2_run_is_stored_by_the_scheduler_and_named(monkeypatch, tmp_path):
    db = str(tmp_path / "v2.db")
    monkeypatch.setenv("SPECSCOPE_DB", db)
    monkeypatch.setenv("SPECSCOPE_RUN_ID", "runner-v2")
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.32.0"))
    session = _session.Session(_config(use_v2_model_runner=True), has_model=False)
    tracer = session.tracer
    tracer.start_request("r0", prompt_tokens=12, temperature=0.0)
    for accepted in (2, 0, 3, 1) * 5:
        tracer.record_verify("r0", proposed=3, accepted=accepted)
    tracer.finish_request("r0", output_tokens=45)
    session.close()
    with open_store(db, read_only=True) as store:
        report = diagnose(store, "runner-v2")
        _, rows = store.query("SELECT graph_mode FROM run_ranks WHERE run_id = 'runner-v2'")
    assert rows == [("compiled",)]  # the scheduler owns the rank row: no worker will write one
    assert report.codes() == ["RUNNER_NOT_ATTACHED"]
    (run,) = report.runs
    assert run.verify_steps == 20 and run.mean_acceptance_length == pytest.approx(2.5)
