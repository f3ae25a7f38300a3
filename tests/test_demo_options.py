"""The demo's options without running the engine: a fault on one rank only, run ids of a Tracer's
length, and bad options refused as one line with exit 2."""

from __future__ import annotations

import pytest

from specscope.adapters.reference import DemoOptions
from specscope.cli import main
from specscope.cli.demo import VLLM_CRASHES, stopped
from specscope.engine.faults import parse_rank_fault
from specscope.engine.vllm_run import VLLM_FAULTS
from specscope.errors import ConfigError


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
