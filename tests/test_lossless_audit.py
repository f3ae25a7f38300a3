"""The losslessness audit (docs/design.md, "Losslessness audit"): the per-token judgement, the sampled
test's false-alarm bound and power as the store's view computes them, and the reference engine's
audit healthy, sampled and with a verifier that emits the draft's token. Real vLLM's audit is in
tests/test_vllm.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specscope import metrics
from specscope.doctor import diagnose
from specscope.events import LosslessAudit, prompt_key, sampling_label
from specscope.instrumentation import Auditor, AuditSlot, token_stats, truncate
from specscope.storage import open_store

EPS = 1e-4


def test_greedy_slots_mismatch_only_below_the_maximum():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0],   # tie at the top: either token is the target's
                           [1.0, 3.0, 2.0, 0.0],
                           [1.0, 3.0, 2.0, 0.0]])
    stats = token_stats(logits, torch.tensor([2, 2, -1]), torch.zeros(3))
    valid, greedy, mismatch = stats[:, 0].tolist(), stats[:, 1].tolist(), stats[:, 2].tolist()
    assert valid == [1, 1, 0] and greedy == [1, 1, 1]
    assert mismatch == [0, 1, 0]  # the tie passes, token 2 below 3 fails, the empty slot is no token
    assert stats[:, 8].tolist() == [1, 1, 1]  # the target's own token (first of a tie)


def test_sampled_slots_measure_rare_tokens_against_the_mass_below_epsilon():
    probs = torch.tensor([0.6, 0.39995, 0.00004, 0.00001])
    logits = probs.log()[None].repeat(2, 1)
    stats = token_stats(logits, torch.tensor([0, 2]), torch.ones(2), epsilon=EPS)
    p, rare, mass, p2 = stats[:, 3], stats[:, 4], stats[:, 5], stats[:, 6]
    assert p.tolist() == pytest.approx([0.6, 0.00004], rel=1e-4)
    assert rare.tolist() == [0, 1]
    assert mass.tolist() == pytest.approx([0.00005, 0.00005], rel=1e-3)
    assert p2.tolist() == pytest.approx([float((probs ** 2).sum())] * 2, rel=1e-4)
    assert stats[:, 2].tolist() == [0, 0]  # sampled slots are never greedy mismatches


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.floats(0.05, 1.0))
def test_truncation_keeps_what_vllm_keeps(seed, k, p):
    """The audit's top-k / top-p rule equals vLLM's own sampler's (``apply_top_k_top_p``)."""
    topk_topp = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(seed)) * 3
    top_p = torch.tensor([1.0, p, p])
    ours = torch.isfinite(truncate(logits, torch.tensor([k, 0, k]), top_p))
    # vLLM's batch spells "no top-k" as the vocabulary size (gpu_input_batch.py), specscope as 0
    theirs = torch.isfinite(topk_topp.apply_top_k_top_p(logits.clone(), torch.tensor([k, 40, k]), top_p.clone()))
    assert torch.equal(ours, theirs)
    assert ours[0].sum() == k


def test_sampling_labels():
    assert sampling_label(None) is None
    assert sampling_label(0.0, 0.9, 50) == "greedy"
    assert sampling_label(0.8) == "T=0.8"
    assert sampling_label(0.8, 0.95, 40) == "T=0.8 top_p=0.95 top_k=40"
    assert sampling_label(1.0, 1.0, -1) == "T=1"


def _simulated_audits(run_id: str, generator: torch.Generator, tokens: int, corrupt: float) -> list:
    """One request's audit of ``tokens`` positions: draws from random target distributions (a share
    ``corrupt`` replaced by uniform draws over the vocabulary, a broken sampler), judged by the audit."""
    events = []
    auditor = Auditor(events.append, run_id, 0, every=1, epsilon=EPS)
    logits = torch.randn(tokens, 2000, generator=generator) * 4  # peaked like a chat model: mean top p 0.5
    probs = (logits / 0.8).softmax(-1)
    emitted = torch.multinomial(probs, 1, generator=generator)[:, 0]
    broken = torch.rand(tokens, generator=generator) < corrupt
    emitted = torch.where(broken, torch.randint(0, 2000, (tokens,), generator=generator), emitted)
    auditor.submit(logits, emitted, torch.full((tokens,), 0.8),
                   [AuditSlot(f"{run_id}-r", "T=0.8", j) for j in range(tokens)])
    auditor.drain(wait=True)
    return events


def test_sampled_test_false_alarms_stay_under_its_bound_and_catch_a_broken_sampler(tmp_path):
    generator = torch.Generator().manual_seed(7)
    with open_store(str(tmp_path / "sim.db")) as store:
        healthy = [e for i in range(300) for e in _simulated_audits(f"ok{i}", generator, 200, 0.0)]
        broken = [e for i in range(50) for e in _simulated_audits(f"bad{i}", generator, 200, 0.08)]
        store.write(healthy + broken)
        _, rows = store.query("SELECT run_id, verdict, rare_observed, rare_threshold FROM v_lossless_audit")
    verdicts = {row[0]: row[1] for row in rows}
    false_alarms = sum(verdicts[f"ok{i}"] == "violation" for i in range(300))
    caught = sum(verdicts[f"bad{i}"] == "violation" for i in range(50))
    assert false_alarms == 0  # bound 1e-3 per run: 300 runs expect 0.3 at the very most
    assert caught >= 45, (caught, rows[-3:])  # 8% uniform junk in 200 tokens: ~15 rare vs ~1 expected


def test_views_split_audit_and_acceptance_by_sampling_group(store):
    from specscope.events import RequestStart, RunStart, VerifyStep

    run = "r1"
    store.write([
        RunStart(run, "e", "1", "t", "d", {}),
        RequestStart(run, "a", 0, 5, temperature=0.0, prompt_key=prompt_key("hi")),
        RequestStart(run, "b", 0, 5, temperature=0.8, top_p=0.9),
        VerifyStep(run, "a", 0, 0, 3, 2), VerifyStep(run, "b", 0, 0, 3, 0),
        LosslessAudit(run, 0, "a", "greedy", tokens=3, mismatches=1, epsilon=EPS,
                      example={"position": 1, "emitted_token": 5, "target_argmax": 7}),
        LosslessAudit(run, 0, "b", "T=0.8 top_p=0.9", tokens=10, rare=1, rare_expected=0.5, p_sum=4.0,
                      p2_sum=5.0, epsilon=EPS),
    ])
    _, audit = store.query("SELECT sampling, tokens_audited, greedy_mismatches, rare_observed, verdict, "
                           "mean_p_emitted, mean_p_expected FROM v_lossless_audit ORDER BY sampling")
    assert [tuple(r) for r in audit] == [("T=0.8 top_p=0.9", 10, 0, 1, "passed", 0.4, 0.5),
                                         ("greedy", 3, 1, 0, "violation", 0.0, 0.0)]
    _, groups = store.query("SELECT sampling, requests, verify_steps, mean_acceptance_length "
                            "FROM v_sampling_acceptance ORDER BY sampling")
    assert [tuple(r) for r in groups] == [("T=0.8 top_p=0.9", 1, 1, 1.0), ("greedy", 1, 1, 3.0)]
    _, keys = store.query("SELECT request_id, prompt_key, temperature, top_p FROM requests ORDER BY request_id")
    assert keys[0][1] and len(keys[0][1]) == 16 and keys[1][1] is None and tuple(keys[1][2:]) == (0.8, 0.9)
    report = diagnose(store, run)
    (violation,) = [f for f in report.findings if f.code == "LOSSLESS_VIOLATION"]
    assert violation.severity == "error" and violation.evidence["sampling"] == "greedy"
    assert violation.evidence["examples"][0]["target_argmax"] == 7 and report.exit_code == 1


@pytest.mark.parametrize("tokens, judged", [(11, False), (5000, True)], ids=["few", "many"])
def test_a_passed_sampled_group_says_what_its_size_could_not_see(store, tokens, judged):
    from specscope.events import RequestStart, RunStart, VerifyStep

    run = f"r-{tokens}"
    store.write([RunStart(run, "e", "1", "t", "d", {}), RequestStart(run, "b", 0, 5, temperature=0.8),
                 VerifyStep(run, "b", 0, 0, 3, 1),
                 LosslessAudit(run, 0, "b", "T=0.8", tokens=tokens, rare=2, rare_expected=tokens / 100,
                               p_sum=tokens / 2, p2_sum=tokens / 3, epsilon=EPS)])
    (audited,) = [f for f in diagnose(store, run).findings if f.code == "LOSSLESS_AUDITED"]
    share = audited.evidence["groups"][0]["undetectable_below"]
    assert ("too few to judge" in audited.message) == (not judged) and (share >= 0.1) == (not judged)


# -- the reference engine, audited ------------------------------------------------------------------

@pytest.fixture(scope="module")
def audited_runs(target_pair, tmp_path_factory):
    """Reference-engine runs audited at every verify step: healthy greedy, healthy T=0.8, and the
    ``emit-draft-token`` verifier, in one store: ``(store path, {name: (run_id, results)})``."""
    from specscope.collector import Collector
    from specscope.engine import Engine, heldout_prompts
    from specscope.instrumentation import Tracer

    db = str(tmp_path_factory.mktemp("audit") / "audit.db")
    out = {}
    for name, fault, temperature in (("greedy", None, 0.0), ("sampled", None, 0.8),
                                     ("emit-draft-token", "emit-draft-token", 0.0)):
        engine = Engine(target=target_pair, fault=fault)
        with Collector(db) as collector:
            engine.tracer = Tracer(collector, engine="specscope-reference", engine_version="0",
                                   target_model="t", draft_model="d", config=engine.run_config(),
                                   fault=fault, audit_every=1)
            results = engine.generate(heldout_prompts()[:2], max_new_tokens=20, temperature=temperature)
            engine.tracer.close()
        out[name] = (engine.tracer.run_id, results)
    return db, out


@pytest.mark.slow
def test_reference_engine_audit_passes_healthy_runs(audited_runs):
    db, runs = audited_runs
    with open_store(db, read_only=True) as store:
        for name in ("greedy", "sampled"):
            report = diagnose(store, runs[name][0])
            codes = report.codes()
            assert "LOSSLESS_AUDITED" in codes and "LOSSLESS_VIOLATION" not in codes, (name, codes)
            (group,) = report.runs[0].lossless_audit
            emitted = sum(len(r.token_ids) for r in runs[name][1]) - len(runs[name][1])  # minus prefill tokens
            # every token a verify step emitted, those cut at max_new_tokens too
            assert group["tokens_audited"] >= emitted and group["verdict"] == "passed"
            assert group["sampling"] == ("greedy" if name == "greedy" else "T=0.8")


@pytest.mark.slow
def test_a_verifier_emitting_draft_tokens_is_named_with_acceptance_unchanged(audited_runs):
    db, runs = audited_runs
    healthy, broken = runs["greedy"][1], runs["emit-draft-token"][1]
    # the first verify step decides as the healthy one (later ones see another context) ...
    assert [r.accepted[0] for r in broken] == [r.accepted[0] for r in healthy]
    assert [r.token_ids for r in broken] != [r.token_ids for r in healthy]
    # ... and acceptance stays in the healthy range: only the audit sees the fault
    assert metrics.mean_acceptance_length([a for r in broken for a in r.accepted]) > 1.3
    with open_store(db, read_only=True) as store:
        report = diagnose(store, runs["emit-draft-token"][0])
    (violation,) = [f for f in report.findings if f.code == "LOSSLESS_VIOLATION"]
    evidence = violation.evidence
    assert evidence["greedy_mismatches"] > 0 and evidence["tokens_audited"] > evidence["greedy_mismatches"]
    example = evidence["examples"][0]
    assert example["emitted_token"] != example["target_argmax"] and "draft's token" in violation.fix
    assert report.exit_code == 1


@pytest.mark.parametrize("bad", [dict(tokens=0), dict(tokens=3, mismatches=-1), dict(tokens=3, mismatches=4),
                                 dict(tokens=3, rare=1.5), dict(tokens=3, rare_expected=float("nan")),
                                 dict(tokens=3, rare_expected=-1.0), dict(tokens=3, p_sum=float("inf")),
                                 dict(tokens=3, example=["not", "a", "dict"])])
def test_an_audit_that_contradicts_itself_is_refused_at_the_boundary(bad):
    from specscope.errors import InvalidEvent

    with pytest.raises(InvalidEvent, match="lossless audit"):
        LosslessAudit("r", 0, "q", "T=0.8", **bad)


def test_rows_written_around_the_store_do_not_break_the_view_or_the_doctor(store):
    """A zero-token row or a list as example (raw SQL, a restored dump): NULL means, no division
    error, the example skipped, the group judged on what is there."""
    from specscope.events import RunStart

    store.write([RunStart("raw", "e", "1", "t", "d", {}),
                 LosslessAudit("raw", 0, "q", "greedy", tokens=4, mismatches=1, example={"position": 0})])
    with store._write_engine.begin() as conn:  # noqa: SLF001 - the test writes around the Store on purpose
        conn.exec_driver_sql("INSERT INTO lossless_audit (run_id, rank, request_id, sampling, tokens, mismatches, "
                             "rare, rare_expected, p_sum, p2_sum, epsilon, example, ts_wall) VALUES "
                             "('raw', 0, 'z', 'T=1', 0, 0, 0, 0, 0, 0, 0.0001, '[1]', 0)")
    _, rows = store.query("SELECT sampling, tokens_audited, mean_p_emitted, verdict FROM v_lossless_audit "
                          "ORDER BY sampling")
    assert [tuple(r) for r in rows] == [("T=1", 0, None, "passed"), ("greedy", 4, 0.0, "violation")]
    report = diagnose(store, "raw")
    (violation,) = [f for f in report.findings if f.code == "LOSSLESS_VIOLATION"]
    assert violation.evidence["examples"] == [{"position": 0, "request_id": "q"}]


def test_counts_past_a_database_integer_are_refused_not_wrapped():
    """PostgreSQL's binary COPY would store 2**31 tokens as -2**31 (a violation read as passed)."""
    from specscope.errors import InvalidEvent
    from specscope.events import VerifyStep

    with pytest.raises(InvalidEvent, match="tokens"):
        LosslessAudit("r", 0, "q", "greedy", tokens=2**31)
    with pytest.raises(InvalidEvent, match="step"):
        VerifyStep("r", "q", 0, 2**32 + 1, 4, 1)
