"""Checkpoint verdicts that depend on the engine served, and their reading against a run's acceptance.

The drafts are the ones ``specscope.engine.vllm_run`` serves through real vLLM in tests/test_vllm.py
(which checks what vLLM does with each); here the inspector's verdict for vLLM and for SGLang, and the
doctor's reading of a stored warning against healthy and collapsed acceptance.
"""

from __future__ import annotations

import dataclasses

import pytest

from specscope.cli import main
from specscope.doctor import DoctorReport, RunSummary, as_inspected
from specscope.engine import vllm_run
from specscope.events import Finding
from specscope.inspector import inspect_checkpoint

# fault -> {engine: {code: severity}} for the codes at warning or error
VERDICTS = {
    "t2d-mismatch": {"vllm": {"VOCAB_MAP_MISMATCH": "warning"}},
    "d2t-wrong": {"vllm": {"VOCAB_MAP_MISMATCH": "error"}, "sglang": {"VOCAB_MAP_MISMATCH": "error"}},
    "vocab-size-padded": {"vllm": {"VOCAB_SIZE_MISMATCH": "warning"},
                          "sglang": {"VOCAB_SIZE_MISMATCH": "error"}},
    "aux-reversed": {"vllm": {"AUX_LAYER_IDS_ORDER": "warning"},
                     "sglang": {"AUX_LAYER_IDS_ORDER": "warning"}},
    "aux-duplicated": {"vllm": {"AUX_LAYER_COUNT_MISMATCH": "error", "AUX_LAYER_IDS_ORDER": "warning"},
                       "sglang": {"AUX_LAYER_IDS_ORDER": "warning"}},
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    work = tmp_path_factory.mktemp("drafts")
    return {fault: vllm_run.prepare(fault, work) for fault in VERDICTS}


@pytest.mark.parametrize("fault", VERDICTS)
def test_verdict_follows_what_the_engine_does(drafts, fault):
    target, draft = drafts[fault]
    for engine, expected in VERDICTS[fault].items():
        found = {f.code: f.severity for f in inspect_checkpoint(draft, engine=engine, target=target).findings
                 if f.severity in ("error", "warning") and f.code in {c for v in VERDICTS.values() for e in v.values()
                                                                      for c in e}}
        assert found == expected, (fault, engine)


@pytest.mark.parametrize(("fault", "broken", "exit_code"), [("d2t-wrong", "d2t", 1), ("t2d-mismatch", "t2d", 0)])
def test_inspect_names_the_broken_map_and_exits_by_it(drafts, capsys, fault, broken, exit_code):
    """What `specscope inspect --engine vllm --target` says of the drafts vLLM serves in tests/test_vllm.py."""
    target, draft = drafts[fault]
    assert main(["inspect", str(draft), "--engine", "vllm", "--target", str(target)]) == exit_code
    out = capsys.readouterr().out
    assert "VOCAB_MAP_MISMATCH: " in out and f"{broken} is the broken map" in out


def test_duplicated_id_names_vllms_capture_and_the_failing_forward(drafts):
    target, draft = drafts["aux-duplicated"]
    (count,) = [f for f in inspect_checkpoint(draft, engine="vllm", target=target).findings
                if f.code == "AUX_LAYER_COUNT_MISMATCH"]
    assert "[2, 15]" in count.message and "first forward fails" in count.message
    assert count.evidence["captured_layers"] == 2 and count.evidence["fc_in_features"] == 1728


def _run(al: float | None, steps: int) -> RunSummary:
    return RunSummary(run_id="r", engine="vllm", fault=None, requests=3, verify_steps=steps,
                      mean_acceptance_length=al, acceptance_rate=None)


WARNING = Finding("AUX_LAYER_IDS_ORDER", "warning", "ids not ascending", {"configured": [27, 15, 2]}, "Write them ascending.",
                  run_id="r", source="inspect")
COLLAPSE = Finding("ACCEPT_COLLAPSE", "error", "acceptance collapsed", {"mean_acceptance_length": 1.0},
                   "Find the broken link.", run_id="r")


def test_healthy_acceptance_settles_a_checkpoint_warning_as_info():
    (settled,) = DoctorReport([_run(1.65, 100)], []).with_checkpoint([WARNING]).findings
    assert settled.severity == "info" and "healthy acceptance (AL 1.65 over 100 verify steps" in settled.message
    assert settled.evidence["served_verify_steps"] == 100


@pytest.mark.parametrize("run", [_run(1.65, 5), _run(None, 0)], ids=["too-few-steps", "no-steps"])
def test_too_little_evidence_leaves_the_warning(run):
    (kept,) = DoctorReport([run], []).with_checkpoint([WARNING]).findings
    assert kept == WARNING


def test_collapse_names_the_checkpoint_finding_as_likeliest_cause_and_keeps_it_a_warning():
    report = DoctorReport([_run(1.0, 100)], [COLLAPSE]).with_checkpoint([WARNING])
    collapse, warning = report.findings
    assert collapse.code == "ACCEPT_COLLAPSE" and collapse.severity == "error"
    assert "likeliest cause, from the draft checkpoint: AUX_LAYER_IDS_ORDER" in collapse.message
    assert collapse.evidence["likely_causes"] == ["AUX_LAYER_IDS_ORDER"]
    assert warning == WARNING


def test_a_collapse_names_the_broken_d2t_with_its_evidence_and_fix(drafts):
    """The d2t-wrong draft's real inspection beside a collapsed run: the collapse names d2t."""
    target, draft = drafts["d2t-wrong"]
    stored = [dataclasses.replace(f, run_id="r") for f in inspect_checkpoint(draft, engine="vllm", target=target).findings]
    collapse = next(f for f in DoctorReport([_run(1.0, 100)], [COLLAPSE]).with_checkpoint(stored).findings
                    if f.code == "ACCEPT_COLLAPSE")
    assert collapse.evidence["likely_causes"][0] == "VOCAB_MAP_MISMATCH"
    assert collapse.evidence["likely_cause_evidence"]["broken_map"] == "d2t"
    assert "d2t is the broken map" in collapse.message and collapse.fix.startswith("Rebuild d2t from t2d")


def test_checkpoint_errors_are_never_settled_by_acceptance():
    error = Finding("VOCAB_SIZE_MISMATCH", "error", "vocab", {}, "fix", run_id="r", source="inspect")
    (kept,) = DoctorReport([_run(1.65, 100)], []).with_checkpoint([error]).findings
    assert kept == error


def test_a_settled_warning_is_read_from_the_inspection_every_time():
    """What a reading stores (the settled info) is not what the next reading starts from: the
    original severity and message come back, so a run that later collapses un-settles it."""
    (settled,) = DoctorReport([_run(1.65, 100)], []).with_checkpoint([WARNING]).findings
    (again,) = DoctorReport([_run(1.65, 100)], []).with_checkpoint(
        [as_inspected(settled)]).findings
    assert again.message == settled.message  # no note appended twice
    collapse, kept = DoctorReport([_run(1.0, 100)], [COLLAPSE]).with_checkpoint([as_inspected(settled)]).findings
    assert kept == WARNING and collapse.evidence["likely_causes"] == ["AUX_LAYER_IDS_ORDER"]


@pytest.mark.parametrize("code", ["RANK_DIVERGENCE", "ACCEPT_SATURATED"])
def test_a_run_whose_acceptance_is_suspect_settles_nothing(code):
    symptom = Finding(code, "warning", "suspect", {}, "fix", run_id="r")
    assert WARNING in DoctorReport([_run(1.65, 100)], [symptom]).with_checkpoint([WARNING]).findings
