"""specscope.instrumentation end to end: real Collector into a tmp SQLite store, read back with
SQLAlchemy; and the load check against real safetensors files."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
import torch
from _draft_fixture import AUX, HIDDEN, LAYERS, K, ListSink, TinyEagle3Draft, make_models, run_config, run_engine
from safetensors.torch import save_file

from specscope.collector import Collector
from specscope.errors import CheckpointError, ConfigError
from specscope.events import LoadReport
from specscope.instrumentation import Tracer, check_load, instrument
from specscope.storage import open_store
from specscope.storage.schema import load_reports, provenance, run_ranks, runs, tensor_events, verify_steps

FUSED = len(AUX) * HIDDEN


def traced_run(store, capture: str, run_id: str) -> None:
    target, draft = make_models()
    with Collector(store) as collector:
        with Tracer(collector, run_id=run_id, engine="test-engine", engine_version="0.0",
                    target_model="tiny-llama", draft_model="tiny-eagle3", config=run_config(),
                    fault=None if capture == "ok" else f"aux_{capture}", provenance_every=1) as tracer:
            instrument(tracer, draft=draft, target=target, modules=("fc",))
            run_engine(target, draft, tracer, capture=capture, requests=2, steps=3)
        assert collector.flush()


def test_healthy_and_unfused_runs_land_in_the_store(tmp_path):
    with open_store(str(tmp_path / "trace.db")) as store:
        traced_run(store, "ok", "healthy")
        traced_run(store, "off", "aux-off")
        with store.connect() as conn:
            run_rows = {r.run_id: r for r in conn.execute(sa.select(runs))}
            assert set(run_rows) == {"healthy", "aux-off"}
            assert json.loads(run_rows["healthy"].config)["expected_fused_width"] == FUSED
            ranks = {r.run_id: r for r in conn.execute(sa.select(run_ranks))}
            assert ranks["healthy"].hook_calls > 0 and ranks["healthy"].hook_errors == 0
            assert ranks["healthy"].graph_mode == "eager" and ranks["healthy"].ended_wall is not None
            steps = conn.execute(sa.select(sa.func.count()).select_from(verify_steps)
                                 .where(verify_steps.c.run_id == "healthy")).scalar_one()
            assert steps == 2 * 3
            # The doctor's AUX_NOT_FUSED evidence: target-fed calls observed at target width.
            evidence = conn.execute(
                sa.select(tensor_events.c.run_id, tensor_events.c.width, tensor_events.c.expected_width)
                .where(tensor_events.c.hook_point == "draft.forward:hidden_states",
                       tensor_events.c.expected_width == FUSED,
                       tensor_events.c.width != tensor_events.c.expected_width)).all()
            assert {tuple(r) for r in evidence} == {("aux-off", HIDDEN, FUSED)}
            contract = conn.execute(sa.text(
                "SELECT width, expected_width, calls FROM v_tensor_contract "
                "WHERE run_id = 'healthy' AND hook_point = 'draft.forward:hidden_states' "
                "ORDER BY expected_width")).all()
            assert {(r.width, r.expected_width) for r in contract} == {(HIDDEN, HIDDEN), (FUSED, FUSED)}
            # Default sampling: 2 * 3 * K draft calls, the first 8 recorded, no new signature later.
            assert sum(r.calls for r in contract) == 8 < 2 * 3 * K
            rows = conn.execute(sa.select(provenance)).all()
            assert len(rows) == 2 * 2 * 3  # every target-fed call of both runs
            received = {(r.run_id, tuple(json.loads(r.received)), r.matches) for r in rows}
            assert received == {("healthy", AUX, True), ("aux-off", (LAYERS,), False)}


def speculators_checkpoint(draft: TinyEagle3Draft) -> dict[str, torch.Tensor]:
    """The draft's weights in the speculators layout: ``layers.0.*`` instead of ``midlayer.*``."""
    return {k.replace("midlayer.", "layers.0.", 1): v.contiguous() for k, v in draft.state_dict().items()}


def test_load_check_reports_dropped_layer_for_the_reference_loader(tmp_path):
    draft = TinyEagle3Draft()
    path = tmp_path / "model.safetensors"
    save_file(speculators_checkpoint(draft), str(path))
    with open_store(str(tmp_path / "trace.db")) as store:
        with Collector(store) as collector, Tracer(
                collector, run_id="load", engine="reference", engine_version="0", target_model="t",
                draft_model="d", config=run_config()) as tracer:
            report = check_load(tracer, draft, path, engine="reference")
        layer_keys = sorted(k for k in draft.state_dict() if k.startswith("midlayer."))
        assert report.unexpected == tuple(k.replace("midlayer.", "layers.0.") for k in layer_keys)
        assert report.missing == tuple(layer_keys)
        assert report.renamed == () and not report.strict
        assert report.loaded == len(draft.state_dict()) - len(layer_keys)
        assert report.source == str(path) and report.module == "draft"
        with store.connect() as conn:
            (row,) = conn.execute(sa.select(load_reports)).all()
        assert json.loads(row.unexpected) == list(report.unexpected)
        assert json.loads(row.missing) == layer_keys


def test_load_check_reports_renamed_keys_for_sglang():
    draft = TinyEagle3Draft()
    checkpoint = {f"model.{k}": v for k, v in draft.state_dict().items()}
    checkpoint["d2t"] = torch.zeros(8, dtype=torch.long)
    sink = ListSink()
    with Tracer(sink, engine="sglang", engine_version="0", target_model="t", draft_model="d",
                config=run_config()) as tracer:
        report = check_load(tracer, draft, checkpoint, engine="sglang", module_name="draft.model")
    assert report.renamed == tuple(sorted((f"model.{k}", k) for k in draft.state_dict()))
    assert report.missing == () and report.unexpected == ()
    assert report.loaded == len(draft.state_dict()) and report.source == "state_dict"
    assert sink.of(LoadReport) == [report]


def test_load_check_takes_key_lists_and_rejects_bad_input(tmp_path):
    with Tracer(ListSink(), engine="vllm", engine_version="0", target_model="t", draft_model="d",
                config=run_config()) as tracer:
        report = check_load(tracer, ["layers.0.mlp.up_proj.weight", "fc.weight"],
                            ["midlayer.mlp.up_proj.weight", "fc.weight", "t2d"], engine="vllm")
        assert report.renamed == (("midlayer.mlp.up_proj.weight", "layers.0.mlp.up_proj.weight"),)
        assert report.loaded == 2 and report.strict  # vLLM fails on unmapped keys
        broken = tmp_path / "broken.safetensors"
        broken.write_bytes(b"not a safetensors file")
        with pytest.raises(CheckpointError, match="broken.safetensors"):
            check_load(tracer, ["fc.weight"], broken)
        with pytest.raises(CheckpointError):
            check_load(tracer, ["fc.weight"], tmp_path / "absent.safetensors")
        with pytest.raises(ConfigError, match="unknown engine"):
            check_load(tracer, ["fc.weight"], ["fc.weight"], engine="tgi")
