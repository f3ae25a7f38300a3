"""EAGLE-3 conventions: capture layers and what each engine's loader does with checkpoint keys."""

from __future__ import annotations

import pytest

from specscope import conventions as cv
from specscope.errors import ConfigError

MIDLAYER_KEYS = cv.canonical_draft_keys(layer_prefix="midlayer.")
LAYERS0_KEYS = cv.canonical_draft_keys(layer_prefix="layers.0.")


def test_default_aux_layers_follow_two_half_minus_three():
    assert cv.default_aux_layer_ids(30) == (2, 15, 27)
    assert cv.default_aux_layer_ids(61) == (2, 30, 58)
    with pytest.raises(ConfigError):
        cv.default_aux_layer_ids(3)


def test_explicit_ids_mean_different_layers_per_engine():
    assert cv.physical_capture_layers("sglang", [2, 12, 21], 24) == (3, 13, 22)
    for engine in ("vllm", "speculators", "eagle", "reference"):
        assert cv.physical_capture_layers(engine, [2, 12, 21], 24) == (2, 12, 21)


def test_vllm_fuses_aux_ids_sorted_and_once_the_others_as_listed():
    assert cv.physical_capture_layers("vllm", [27, 15, 2], 30) == (2, 15, 27)
    assert cv.physical_capture_layers("vllm", [2, 15, 15], 30) == (2, 15)
    assert cv.physical_capture_layers("vllm", [], 30) == (2, 15, 27)  # no ids: the defaults
    assert cv.physical_capture_layers("sglang", [27, 15, 2], 30) == (28, 16, 3)
    for engine in ("speculators", "eagle", "reference"):
        assert cv.physical_capture_layers(engine, [2, 15, 15], 30) == (2, 15, 15)


def test_defaults_agree_across_engines():
    assert {cv.physical_capture_layers(e, None, 30) for e in cv.ENGINES} == {(2, 15, 27)}
    with pytest.raises(ConfigError):
        cv.physical_capture_layers("vllm", None, None)


def test_unknown_engine_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown engine"):
        cv.map_checkpoint_key("tgi", "fc.weight")


def test_key_mapping_per_engine():
    assert cv.map_checkpoint_key("vllm", "midlayer.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert cv.map_checkpoint_key("vllm", "d2t") == "draft_id_to_target_id"
    assert cv.map_checkpoint_key("vllm", "t2d") is None
    assert cv.map_checkpoint_key("sglang", "d2t") is None
    assert cv.map_checkpoint_key("sglang", "model.fc.weight") == "fc.weight"
    assert cv.map_checkpoint_key("sglang", "layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert cv.map_checkpoint_key("eagle", "midlayer.hidden_norm.weight") == "midlayer.hidden_norm.weight"


def test_sglang_drops_a_speculators_layer_silently():
    plan = cv.plan_load("sglang", LAYERS0_KEYS)
    assert set(plan.dropped) == {k for k in LAYERS0_KEYS if k.startswith("layers.0.")}
    assert "midlayer.self_attn.q_proj.weight" in plan.missing
    assert set(plan.consumed) == {"d2t", "t2d"}
    assert not plan.strict


def test_vllm_renames_midlayer_and_loads_layers0():
    plan = cv.plan_load("vllm", MIDLAYER_KEYS)
    assert ("midlayer.norm.weight", "layers.0.norm.weight") not in plan.renamed
    assert ("midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight") in plan.renamed
    assert ("d2t", "draft_id_to_target_id") in plan.renamed
    assert plan.consumed == ("t2d",) and plan.dropped == () and plan.missing == ()
    plan = cv.plan_load("vllm", LAYERS0_KEYS)
    assert plan.dropped == () and plan.missing == () and plan.strict


@pytest.mark.parametrize("engine", ["eagle", "reference"])
def test_older_loaders_drop_layers0(engine):
    plan = cv.plan_load(engine, LAYERS0_KEYS)
    assert len(plan.dropped) == 10 and len(plan.missing) == 10
    assert cv.plan_load(engine, MIDLAYER_KEYS).dropped == ()


def test_speculators_drops_midlayer():
    plan = cv.plan_load("speculators", MIDLAYER_KEYS)
    assert all(k.startswith("midlayer.") for k in plan.dropped) and len(plan.dropped) == 10
    assert "d2t" in plan.loaded and "t2d" in plan.loaded


def test_missing_lm_head_and_optional_embedding():
    keys = [k for k in MIDLAYER_KEYS if k != "lm_head.weight"] + ["embed_tokens.weight"]
    plan = cv.plan_load("sglang", keys)
    assert plan.missing == ("lm_head.weight",)
    assert "embed_tokens.weight" in plan.loaded


def test_explicit_expected_params_from_a_module():
    plan = cv.plan_load("reference", ["fc.weight", "extra.bias"], expected_params=["fc.weight", "norm.weight"])
    assert plan.loaded == ("fc.weight",)
    assert plan.dropped == ("extra.bias",)
    assert plan.missing == ("norm.weight",)


def test_expected_params_in_engine_naming():
    vllm = cv.expected_draft_params("vllm")
    assert "layers.0.hidden_norm.weight" in vllm and "draft_id_to_target_id" in vllm and "t2d" not in vllm
    sgl = cv.expected_draft_params("sglang", tied_embeddings=True)
    assert "midlayer.hidden_norm.weight" in sgl and "lm_head.weight" not in sgl and "d2t" not in sgl
    assert "layers.1.mlp.up_proj.weight" in cv.expected_draft_params("speculators", num_layers=2)


def test_each_engine_is_one_record_of_facts():
    vllm, sglang = cv.engine_facts("vllm"), cv.engine_facts("sglang")
    assert vllm.loader.strict and vllm.aux_ids_sorted_unique and vllm.sliding_window_needs_layer_types
    assert sglang.aux_id_offset == 1 and not sglang.loader.strict
    assert vllm.contract["aux_layer_ids"].read_from == "draft"
    assert sglang.shared["lm_head"].read_from is cv.ShareRule.TARGET_IF_NO_DRAFT_VOCAB
    assert cv.AUX_IDS_SORTED_UNIQUE == {"vllm"} and cv.CONTRACT["vllm"] is vllm.contract
    with pytest.raises(ConfigError, match="unknown engine"):
        cv.engine_facts("tgi")


def test_a_record_missing_a_contract_setting_is_refused():
    ref = cv.engine_facts("reference")
    with pytest.raises(ValueError, match="contract facts"):
        cv.EngineFacts(ref.loader, {k: v for k, v in ref.contract.items() if k != "head_dim"}, {}, ref.shared)
    with pytest.raises(ValueError, match="ShareRule"):
        cv.EngineFacts(ref.loader, ref.contract, {}, {"embed_tokens": cv.SettingFact("target", ""),
                                                       "lm_head": ref.shared["lm_head"]})


@pytest.mark.parametrize(("rule", "draft_has", "identical", "draft_vocab", "served"), [
    (cv.ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL, False, None, False, "target"),
    (cv.ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL, True, True, False, "target"),
    (cv.ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL, True, False, False, "draft"),
    (cv.ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL, True, None, False, "unknown"),
    (cv.ShareRule.TARGET_IF_NO_DRAFT_VOCAB, True, None, True, "draft"),
    (cv.ShareRule.TARGET_IF_NO_DRAFT_VOCAB, True, None, False, "target"),
    (cv.ShareRule.DRAFT, False, None, False, "draft"),
])
def test_share_rules_say_whose_tensor_is_served(rule, draft_has, identical, draft_vocab, served):
    assert rule.served(draft_has=draft_has, identical=identical, draft_vocab_size_set=draft_vocab) == served
