"""The draft trainer's pieces on small real tensors: vocabulary maps, training-time-test layout, loss,
the saved data format, and the prompt sets it trains on."""

from __future__ import annotations

import torch
from torch import nn

from specscope.engine import prompts
from specscope.engine.draft import DraftConfig, Eagle3Draft
from specscope.engine.train import (
    IGNORE,
    Example,
    Sequence,
    _soft_cross_entropy,
    build_vocab,
    load_data,
    save_data,
    ttt_loss,
)

VOCAB, DRAFT_VOCAB, EOS, K = 64, 8, 2, 3


def _seq() -> Sequence:
    tokens = torch.tensor([5, 9, 3, 7, 3, 7, 11, EOS])
    labels = torch.tensor([-1, -1, 7, 3, 7, 11, EOS, -1])  # target greedy after each prefix; prompt unknown
    aux = torch.randn(len(tokens) - 1, 3 * 16, dtype=torch.float16)
    answer = labels[2:7]  # positions 2..6 have the target's logits: top-1 is the greedy label
    top_ids = torch.stack([answer, torch.full_like(answer, 40), torch.full_like(answer, 3)], 1).to(torch.int32)
    top_logits = torch.tensor([[4.0, 3.0, 1.0]]).expand(len(answer), K).to(torch.float16)
    return Sequence(tokens, aux, labels, 2, top_logits, top_ids)


def _index(t2d: torch.Tensor) -> torch.Tensor:
    index = torch.full((VOCAB,), -1, dtype=torch.int64)
    index[t2d.nonzero()[:, 0]] = torch.arange(DRAFT_VOCAB)
    return index


def test_build_vocab_gives_offsets_and_consistent_t2d():
    d2t, t2d = build_vocab([_seq()], DRAFT_VOCAB, VOCAB, EOS)
    target_ids = torch.arange(DRAFT_VOCAB) + d2t
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert bool((target_ids[1:] > target_ids[:-1]).all())
    assert int(t2d.sum()) == DRAFT_VOCAB and torch.equal(t2d.nonzero()[:, 0], target_ids)
    assert {EOS, 3, 7, 11} <= set(target_ids.tolist())


def test_example_aligns_tokens_labels_soft_targets_and_greedy_mask():
    seq = _seq()
    _, t2d = build_vocab([seq], DRAFT_VOCAB, VOCAB, EOS)
    index = _index(t2d)
    ex = Example(seq, index, depth=2)
    # step 0, origin t: token x[t+1], label y[t+1]
    assert ex.tokens[0].tolist() == seq.tokens[1:].tolist()
    assert ex.labels[0][0] == IGNORE and ex.labels[0][1] == index[7]
    # soft targets of origin 1 are the target's top-K at position 2, mapped to draft ids (40: not drafted)
    assert ex.soft_ids[0][1].tolist() == [int(index[7]), -1, int(index[3])]
    assert ex.soft_ids[0][0].tolist() == [-1, -1, -1]  # origin 0 has no label: no soft target either
    # step 1 counts only where x[t+2] was the target's greedy token after x[..t+1]
    assert ex.labels[1][0] == IGNORE  # x[2]=3 but y[1] unknown (prompt)
    assert ex.labels[1][1] == index[3]  # x[3]=7 == y[2]=7, label y[3]=3


def test_soft_cross_entropy_renormalises_over_drafted_tokens():
    logits = torch.zeros(1, 1, 4)
    top_logits = torch.tensor([[[2.0, 1.0, 0.0]]])
    top_ids = torch.tensor([[[0, -1, 1]]])  # the middle token is outside the draft vocabulary
    p = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    expected = -(p * torch.log(torch.tensor([0.25, 0.25]))).sum()
    assert torch.isclose(_soft_cross_entropy(logits, top_logits, top_ids), expected)
    empty = _soft_cross_entropy(logits.requires_grad_(), top_logits, torch.full_like(top_ids, -1))
    assert empty.item() == 0.0 and empty.requires_grad  # no drafted token: no loss, still differentiable


def test_ttt_loss_trains_a_real_draft_layer():
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=16, target_hidden_size=16, intermediate_size=32, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB)
    draft = Eagle3Draft(cfg, nn.Embedding(VOCAB, 16))
    seq = _seq()
    _, t2d = build_vocab([seq], DRAFT_VOCAB, VOCAB, EOS)
    batch = [Example(seq, _index(t2d), depth=3)]
    scale = torch.ones(3 * 16)
    opt = torch.optim.Adam(draft.parameters(), lr=1e-2)
    first, stats = ttt_loss(draft, batch, scale, depth=3)
    assert torch.isfinite(first) and len(stats) == 3 and stats[0][1] == 5
    for _ in range(30):
        loss, _ = ttt_loss(draft, batch, scale, depth=3)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first.item()


def test_saved_data_round_trips_with_its_generation_time(tmp_path):
    seq = _seq()
    save_data(tmp_path / "data.pt", [seq, seq], 12.5)
    loaded, seconds = load_data(tmp_path / "data.pt")
    assert seconds == 12.5 and len(loaded) == 2
    assert all(torch.equal(getattr(loaded[1], f), getattr(seq, f)) for f in ("tokens", "aux", "top_ids"))
    assert loaded[0].first == 2


def test_training_and_held_out_prompts_share_no_topic_template_or_prompt():
    train, held_out = prompts.train_prompts(), prompts.heldout_prompts()
    assert len(train) > 1000 and len(set(train)) == len(train) and not set(train) & set(held_out)
    assert not set(prompts._TRAIN_TOPICS) & set(prompts._HELDOUT_TOPICS)
    assert not set(prompts._TRAIN_TEMPLATES) & set(prompts._HELDOUT_TEMPLATES)
    assert not any(topic in p for p in train for topic in prompts._HELDOUT_TOPICS)
