"""One small real checkpoint per finding code: a copy of a healthy small EAGLE-3 checkpoint
(tests/_tiny_eagle3.py, the shape of the shared ok-eagle3 case) with one thing changed.

Each test asserts the code, its evidence numbers, and (test_healthy_case_raises_none) that the
untouched copy raises none of the codes, with every optional check switched on.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specscope.checkpoint_reader import CheckpointReader
from specscope.cli import main
from specscope.inspector import CODES, inspect_checkpoint

TARGET = {"hidden_size": 64, "vocab_size": 1000, "num_hidden_layers": 30}


class Ckpt:
    """A writable copy of the healthy case: ``tensors`` and ``config`` to mutate, then ``write()``."""

    def __init__(self, root: Path, healthy: Path) -> None:
        self.root = root
        self.tensors = load_file(str(healthy / "model.safetensors"))
        self.config = json.loads((healthy / "config.json").read_text())

    def write(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(self.root / "model.safetensors"))
        (self.root / "config.json").write_text(json.dumps(self.config))
        return self.root


@pytest.fixture
def ckpt(tmp_path, ok_eagle3: Path) -> Ckpt:
    return Ckpt(tmp_path / "draft", ok_eagle3)


@pytest.fixture
def target(tmp_path):
    def write(**overrides) -> Path:
        path = tmp_path / "target.json"
        path.write_text(json.dumps({**TARGET, **overrides}))
        return path
    return write


def run(path: Path, *args: str, capsys) -> tuple[int, dict]:
    rc = main(["inspect", str(path), *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def only(report: dict, code: str) -> dict:
    found = [f for f in report["findings"] if f["code"] == code]
    assert len(found) == 1, [f["code"] for f in report["findings"]]
    return found[0]


def codes(report: dict) -> set[str]:
    return {f["code"] for f in report["findings"]}


def test_healthy_case_raises_none(ckpt, target, capsys):
    path = ckpt.write()
    for engine in ("sglang", "vllm", "eagle", "reference"):
        rc, report = run(path, "--engine", engine, "--target-config", str(target()), "--serve-dtype", "fp16",
                         capsys=capsys)
        assert rc == 0 and codes(report) == {"CKPT_FORMAT"}, report["findings"]
    assert len(CODES) == 30  # every code has a test: below, and the contract codes in test_inspector_contract.py


def test_ckpt_format(ckpt, capsys):
    f = only(run(ckpt.write(), capsys=capsys)[1], "CKPT_FORMAT")
    assert f["severity"] == "info"
    assert f["evidence"] == {"tensors": 15, "files": 1, "total_bytes": 133608, "midlayer_keys": 10,
                             "layers0_keys": 0}


def test_keys_dropped_when_layer_saved_as_layers0(ckpt, capsys):
    ckpt.tensors = {k.replace("midlayer.", "layers.0."): v for k, v in ckpt.tensors.items()}
    rc, report = run(ckpt.write(), "--engine", "sglang", capsys=capsys)
    f = only(report, "KEYS_DROPPED")
    assert rc == 1 and f["evidence"]["dropped_keys"] == 10 and f["evidence"]["checkpoint_keys"] == 15
    assert "layers.0." in f["fix"] and "midlayer." in f["fix"]
    assert only(report, "PARAM_MISSING")["evidence"]["missing_params"] == 10
    assert report["keys"]["dropped"] == sorted(report["keys"]["dropped"]) and len(report["keys"]["dropped"]) == 10
    rc, report = run(ckpt.root, "--engine", "vllm", capsys=capsys)
    assert rc == 0 and "KEYS_DROPPED" not in codes(report)


def test_text_shows_evidence_as_the_doctor_does(ckpt, capsys):
    """One renderer: a key list is shortened to its first 3 in text, as the doctor shows the same
    finding stored with a run; every key stays in ``--json``."""
    ckpt.tensors = {k.replace("midlayer.", "layers.0."): v for k, v in ckpt.tensors.items()}
    path = ckpt.write()
    evidence = only(run(path, "--engine", "sglang", capsys=capsys)[1], "KEYS_DROPPED")["evidence"]
    keys = evidence["keys"]
    assert main(["inspect", str(path), "--engine", "sglang"]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ERROR   KEYS_DROPPED: "))
    shown = ", ".join(keys[:3])
    assert lines[at + 1] == (f"        evidence: dropped_keys=10, checkpoint_keys=15, "
                             f"dropped_bytes={evidence['dropped_bytes']}, keys=[{shown}, +{len(keys) - 3} more]")
    assert lines[at + 2].startswith("        fix: ")


def test_keys_dropped_unknown_key_under_strict_vllm(ckpt, capsys):
    ckpt.tensors["midlayer.extra_norm.weight"] = torch.ones(64, dtype=torch.bfloat16)
    report = run(ckpt.write(), "--engine", "vllm", capsys=capsys)[1]
    f = only(report, "KEYS_DROPPED")
    assert f["evidence"]["dropped_keys"] == 1 and f["evidence"]["dropped_bytes"] == 128
    assert "refuses the load" in f["message"] and report["keys"]["strict"] is True


def test_param_missing(ckpt, capsys):
    del ckpt.tensors["midlayer.mlp.down_proj.weight"]
    rc, report = run(ckpt.write(), capsys=capsys)
    f = only(report, "PARAM_MISSING")
    assert rc == 1 and f["evidence"] == {"missing_params": 1, "expected_params": 13,
                                         "params": ["midlayer.mlp.down_proj.weight"]}


def test_lm_head_missing(ckpt, capsys):
    del ckpt.tensors["lm_head.weight"]
    rc, report = run(ckpt.write(), capsys=capsys)
    assert rc == 1 and only(report, "LM_HEAD_MISSING")["evidence"] == {"lm_head_rows": 0, "draft_vocab_size": 128}
    assert "PARAM_MISSING" not in codes(report)


def test_fc_shape_mismatch(ckpt, capsys):
    ckpt.tensors["fc.weight"] = ckpt.tensors["fc.weight"][:, :128]
    ev = only(run(ckpt.write(), capsys=capsys)[1], "FC_SHAPE_MISMATCH")["evidence"]
    assert (ev["fc_in_features"], ev["expected_in_features"]) == (128, 192)
    assert (ev["fc_out_features"], ev["expected_out_features"]) == (64, 64) and ev["fc_aux_layers"] == 2


def test_aux_layer_count_mismatch(ckpt, capsys):
    ckpt.config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 15]}
    report = run(ckpt.write(), capsys=capsys)[1]
    assert only(report, "AUX_LAYER_COUNT_MISMATCH")["evidence"] == {
        "aux_layer_ids": 2, "captured_layers": 2, "fc_aux_layers": 3, "fused_width": 128, "fc_in_features": 192}
    assert "FC_SHAPE_MISMATCH" not in codes(report)


@pytest.mark.parametrize("ids", [[27, 15, 2], [2, 15, 15]], ids=["reversed", "repeated"])
def test_aux_layer_ids_order(ckpt, ids, capsys):
    ckpt.config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    for engine in ("sglang", "vllm"):
        f = only(run(ckpt.write(), "--engine", engine, capsys=capsys)[1], "AUX_LAYER_IDS_ORDER")
        assert f["severity"] == "warning" and f["evidence"]["sorting_engines"] == ["vllm"]
        assert f["evidence"]["sorted_unique"] == sorted(set(ids)) and f["evidence"]["repeated"] == (ids[1] == ids[2])
    report = run(ckpt.write(), "--engine", "vllm", capsys=capsys)[1]
    assert ("AUX_LAYER_COUNT_MISMATCH" in codes(report)) == (ids[1] == ids[2])


def test_aux_layer_ids_convention(ckpt, target, capsys):
    ckpt.config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}
    rc, report = run(ckpt.write(), "--target-config", str(target()), capsys=capsys)
    f = only(report, "AUX_LAYER_IDS_CONVENTION")
    assert rc == 0 and f["severity"] == "warning"
    ev = f["evidence"]
    assert ev["sglang"] == [3, 16, 28] and ev["vllm"] == ev["speculators"] == [2, 15, 27]
    assert ev["num_target_layers"] == 30 and ev["defaults"] == [2, 15, 27]


def _offsets(ckpt: Ckpt) -> torch.Tensor:
    return ckpt.tensors["d2t"]


def test_d2t_absolute_ids(ckpt, capsys):
    ckpt.tensors["d2t"] = _offsets(ckpt) + torch.arange(128)
    ev = only(run(ckpt.write(), capsys=capsys)[1], "D2T_NOT_OFFSETS")["evidence"]
    assert ev["offset_subtractions_observed"] == 0 and ev["offset_subtractions_expected"] == 1
    assert ev["target_vocab_size"] == 1000 and ev["max_target_id"] == 862 + 2 * 127


def test_d2t_converted_twice(ckpt, capsys):
    ckpt.tensors["d2t"] = _offsets(ckpt) - torch.arange(128)
    report = run(ckpt.write(), capsys=capsys)[1]
    assert only(report, "D2T_NOT_OFFSETS")["evidence"]["offset_subtractions_observed"] == 2
    assert "VOCAB_MAP_MISMATCH" not in codes(report)


def test_d2t_invalid_order(ckpt, capsys):
    d2t = _offsets(ckpt).clone()
    ids = d2t + torch.arange(128)
    ids[10], ids[11] = ids[11].clone(), ids[10].clone()
    ckpt.tensors["d2t"] = ids - torch.arange(128)
    ev = only(run(ckpt.write(), capsys=capsys)[1], "D2T_INVALID")["evidence"]
    assert ev["non_increasing_ids"] == 1 and ev["out_of_range_ids"] == 0


def test_d2t_invalid_dtype(ckpt, capsys):
    ckpt.tensors["d2t"] = _offsets(ckpt).float()
    assert only(run(ckpt.write(), capsys=capsys)[1], "D2T_INVALID")["evidence"]["d2t_is_integer"] == 0


def test_vocab_map_mismatch_count(ckpt, capsys):
    t2d = ckpt.tensors["t2d"].clone()
    t2d[(~t2d).nonzero()[0, 0]] = True
    ckpt.tensors["t2d"] = t2d
    rc, report = run(ckpt.write(), "--engine", "vllm", capsys=capsys)
    found = only(report, "VOCAB_MAP_MISMATCH")
    assert found["evidence"] == {"t2d_count": 129, "draft_vocab_size": 128, "broken_map": "t2d",
                                 "certainty": "form", "d2t_read_from": "checkpoint"}
    # vLLM never reads t2d: a warning that says so, not an error that fails a deploy
    assert found["severity"] == "warning" and "never read t2d" in found["message"] and rc == 0


def test_vocab_map_mismatch_ids_and_length(ckpt, capsys):
    t2d = ckpt.tensors["t2d"].clone()
    ids = t2d.nonzero().squeeze(1)
    t2d[ids[5]] = False
    t2d[ids[5] + 1 if not t2d[ids[5] + 1] else ids[5] - 1] = True
    ckpt.tensors["t2d"] = torch.cat([t2d, torch.zeros(4, dtype=torch.bool)])
    ev = only(run(ckpt.write(), capsys=capsys)[1], "VOCAB_MAP_MISMATCH")["evidence"]
    assert ev["t2d_length"] == 1004 and ev["target_vocab_size"] == 1000 and ev["mismatched_ids"] == 1


def test_an_empty_d2t_is_named_once_by_its_length(ckpt, capsys):
    ckpt.tensors["d2t"] = torch.zeros(0, dtype=torch.int64)
    rc, report = run(ckpt.write(), "--engine", "vllm", capsys=capsys)
    assert rc == 1 and only(report, "DRAFT_VOCAB_MISMATCH")["evidence"]["d2t_length"] == 0
    assert codes(report) == {"CKPT_FORMAT", "DRAFT_VOCAB_MISMATCH"}


def test_d2t_identity_with_pruned_vocab(ckpt, capsys):
    ckpt.tensors["d2t"] = torch.zeros(128, dtype=torch.int64)
    t2d = torch.zeros(1000, dtype=torch.bool)
    t2d[:128] = True
    ckpt.tensors["t2d"] = t2d
    rc, report = run(ckpt.write(), capsys=capsys)
    assert rc == 0 and only(report, "D2T_IDENTITY_WITH_PRUNED_VOCAB")["evidence"] == {
        "nonzero_offsets": 0, "draft_vocab_size": 128, "vocab_size": 1000}


def test_draft_vocab_mismatch(ckpt, capsys):
    ckpt.tensors["lm_head.weight"] = ckpt.tensors["lm_head.weight"][:100]
    ev = only(run(ckpt.write(), capsys=capsys)[1], "DRAFT_VOCAB_MISMATCH")["evidence"]
    assert ev == {"lm_head_rows": 100, "draft_vocab_size": 128}


def test_vocab_size_mismatch(ckpt, target, capsys):
    rc, report = run(ckpt.write(), "--target-config", str(target(vocab_size=2000)), capsys=capsys)
    assert rc == 1 and only(report, "VOCAB_SIZE_MISMATCH")["evidence"] == {
        "draft_vocab_size_config": 1000, "target_vocab_size": 2000}


def test_hidden_size_mismatch(ckpt, target, capsys):
    rc, report = run(ckpt.write(), "--target-config", str(target(hidden_size=128)), capsys=capsys)
    assert rc == 1 and only(report, "HIDDEN_SIZE_MISMATCH")["evidence"] == {
        "draft_target_hidden_size": 64, "target_hidden_size": 128}


def test_untrained_weights(ckpt, capsys):
    gen = torch.Generator().manual_seed(0)
    ckpt.tensors["norm.weight"] = torch.ones(64, dtype=torch.bfloat16)
    linear = torch.nn.Linear(128, 64, bias=False)  # torch default init: kaiming uniform
    ckpt.tensors["midlayer.self_attn.q_proj.weight"] = linear.weight.detach().to(torch.bfloat16)
    ckpt.tensors["fc.weight"] = (torch.randn(64, 192, generator=gen) * 0.02).to(torch.bfloat16)
    rc, report = run(ckpt.write(), capsys=capsys)
    f = only(report, "UNTRAINED_WEIGHTS")
    assert rc == 0 and f["severity"] == "warning"
    ev = f["evidence"]
    assert (ev["untrained_tensors"], ev["ones_norms"], ev["init_scale_projections"]) == (3, 1, 2)
    init = {p["name"]: p["init_std"] for p in ev["projections"]}
    assert init["fc.weight"] == pytest.approx(0.02)
    assert init["midlayer.self_attn.q_proj.weight"] == pytest.approx(1 / math.sqrt(128) / math.sqrt(3))


def test_nonfinite_weights(ckpt, capsys):
    w = ckpt.tensors["midlayer.self_attn.o_proj.weight"].clone()
    w[0, 0], w[1, 1] = float("nan"), float("inf")
    ckpt.tensors["midlayer.self_attn.o_proj.weight"] = w
    rc, report = run(ckpt.write(), capsys=capsys)
    ev = only(report, "NONFINITE_WEIGHTS")["evidence"]
    assert rc == 1 and ev["nonfinite_values"] == 2 and ev["tensors"] == 1


def test_fp16_overflow_risk(ckpt, capsys):
    w = ckpt.tensors["midlayer.mlp.down_proj.weight"].clone()
    w[3, 3] = 70000.0
    ckpt.tensors["midlayer.mlp.down_proj.weight"] = w
    path = ckpt.write()
    ev = only(run(path, "--serve-dtype", "fp16", capsys=capsys)[1], "FP16_OVERFLOW_RISK")["evidence"]
    assert ev["absmax"] == pytest.approx(70144.0) and ev["fp16_max"] == 65504.0 and ev["tensors"] == 1
    assert "FP16_OVERFLOW_RISK" not in codes(run(path, "--serve-dtype", "bf16", capsys=capsys)[1])


def test_tied_embeddings_mismatch(ckpt, capsys):
    ckpt.config["tie_word_embeddings"] = True
    rc, report = run(ckpt.write(), capsys=capsys)
    ev = only(report, "TIED_EMBEDDINGS_MISMATCH")["evidence"]
    assert ev["lm_head_rows"] == 128 and ev["draft_vocab_size"] == 128 and ev["vocab_size"] == 1000
    assert "KEYS_DROPPED" not in codes(report)


def test_sharded_set_matches_single_file(ckpt, tmp_path, capsys):
    single = run(ckpt.write(), capsys=capsys)[1]
    shard_dir = tmp_path / "sharded"
    shard_dir.mkdir()
    keys = sorted(ckpt.tensors)
    halves = {"model-00001-of-00002.safetensors": keys[:7], "model-00002-of-00002.safetensors": keys[7:]}
    for name, part in halves.items():
        save_file({k: ckpt.tensors[k] for k in part}, str(shard_dir / name))
    index = {"weight_map": {k: name for name, part in halves.items() for k in part}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(ckpt.root / "config.json", shard_dir / "config.json")
    sharded = run(shard_dir, capsys=capsys)[1]
    assert codes(sharded) == codes(single) == {"CKPT_FORMAT"}
    assert only(sharded, "CKPT_FORMAT")["evidence"]["files"] == 2


def test_chunked_reading_equals_whole_tensor(ckpt):
    reader = CheckpointReader(ckpt.write())
    chunks = list(reader.chunks("fc.weight", chunk_bytes=1000))
    assert len(chunks) > 1
    assert np.array_equal(np.concatenate(chunks), reader.get("fc.weight"))


def test_single_file_uses_sibling_config(ckpt):
    report = inspect_checkpoint(ckpt.write() / "model.safetensors", engine="vllm")
    assert report.exit_code == 0 and report.format == "eagle3"
    assert ("midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight") in report.plan.renamed


def test_exported_names_are_complete():
    import specscope.inspector as inspector

    assert all(hasattr(inspector, name) for name in inspector.__all__)
    assert {"inspect_checkpoint", "InspectionReport", "render_text"} <= set(inspector.__all__)


def test_checks_skipped_without_config_json(ckpt, capsys):
    """Weights alone: the checks that read config.json are named as not run, not passed silently."""
    path = ckpt.write()
    (path / "config.json").unlink()
    rc, report = run(path, capsys=capsys)
    skipped = only(report, "CHECKS_SKIPPED")
    assert rc == 0 and skipped["severity"] == "info"
    assert "AUX_LAYER_IDS_CONVENTION" in skipped["evidence"]["not_checked"]
    assert "CHECKS_SKIPPED" not in codes(run(ckpt.write(), capsys=capsys)[1])


def test_a_zeroed_d2t_is_named_as_the_broken_map(ckpt, capsys):
    """d2t zeroed, t2d still marking the draft's real tokens: the fix rebuilds d2t, not t2d."""
    ckpt.tensors["d2t"] = torch.zeros(128, dtype=torch.int64)
    rc, report = run(ckpt.write(), capsys=capsys)
    assert "D2T_IDENTITY_WITH_PRUNED_VOCAB" in codes(report)
    mismatch = only(report, "VOCAB_MAP_MISMATCH")
    assert mismatch["fix"].startswith("Rebuild d2t from t2d") and "nonzero(t2d)" in mismatch["fix"]
    # an arithmetic run (identity) beside an irregular set: likely, so a warning that says how sure
    assert mismatch["evidence"]["broken_map"] == "d2t" and mismatch["evidence"]["certainty"] == "pattern"
    assert mismatch["severity"] == "warning" and "likely, not measured" in mismatch["message"] and rc == 0


def test_a_default_t2d_is_named_as_the_broken_map(ckpt, capsys):
    """t2d marking the first draft_vocab ids (a default), d2t an irregular set: t2d, which no engine reads."""
    t2d = torch.zeros(1000, dtype=torch.bool)
    t2d[:128] = True
    ckpt.tensors["t2d"] = t2d
    rc, report = run(ckpt.write(), "--engine", "vllm", capsys=capsys)
    mismatch = only(report, "VOCAB_MAP_MISMATCH")
    assert mismatch["evidence"]["broken_map"] == "t2d" and mismatch["evidence"]["certainty"] == "pattern"
    assert mismatch["evidence"]["t2d_ids_arithmetic"] == 1 and mismatch["evidence"]["d2t_ids_arithmetic"] == 0
    assert "Serving is unaffected" in mismatch["message"] and mismatch["fix"].startswith("Derive t2d") and rc == 0


def test_maps_that_disagree_without_evidence_are_undecided_and_say_what_vllm_serves(ckpt, capsys):
    """d2t's ids one above t2d's: both look like pruned vocabularies, no target weights to compare."""
    ckpt.tensors["d2t"] = _offsets(ckpt) + 1
    rc, report = run(ckpt.write(), "--engine", "vllm", capsys=capsys)
    mismatch = only(report, "VOCAB_MAP_MISMATCH")
    assert mismatch["evidence"]["broken_map"] is None and mismatch["evidence"]["certainty"] == "undecided"
    assert mismatch["evidence"]["mismatched_ids"] == 128 and rc == 0
    assert "undecided" in mismatch["message"] and "vllm serves d2t" in mismatch["message"]
    assert "--target" in mismatch["message"] and "Serving is unaffected" not in mismatch["message"]
    assert mismatch["fix"].startswith("If a run of this draft collapsed, d2t is the broken map")
