"""The draft trainer's pieces on small real tensors: vocabulary maps, training-time-test layout, loss."""

from __future__ import annotations

import torch
from torch import nn

from specscope.engine.draft import DraftConfig, Eagle3Draft
from specscope.engine.train import IGNORE, Example, build_vocab, ttt_loss

VOCAB, DRAFT_VOCAB, EOS = 64, 8, 2


def _data():
    seq = torch.tensor([5, 9, 3, 7, 3, 7, 11, EOS])
    labels = torch.tensor([-1, -1, 7, 3, 7, 11, EOS, -1])  # target greedy after each prefix; prompt unknown
    aux = torch.randn(len(seq) - 1, 3 * 16, dtype=torch.float16)
    return seq, aux, labels


def test_build_vocab_gives_offsets_and_consistent_t2d():
    seq, aux, labels = _data()
    d2t, t2d = build_vocab([(seq, aux, labels)], DRAFT_VOCAB, VOCAB, EOS)
    target_ids = torch.arange(DRAFT_VOCAB) + d2t
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert bool((target_ids[1:] > target_ids[:-1]).all())
    assert int(t2d.sum()) == DRAFT_VOCAB and torch.equal(t2d.nonzero()[:, 0], target_ids)
    assert {EOS, 3, 7, 11} <= set(target_ids.tolist())


def test_example_aligns_tokens_labels_and_greedy_mask():
    seq, aux, labels = _data()
    d2t, t2d = build_vocab([(seq, aux, labels)], DRAFT_VOCAB, VOCAB, EOS)
    index = torch.full((VOCAB,), -1, dtype=torch.int64)
    index[t2d.nonzero()[:, 0]] = torch.arange(DRAFT_VOCAB)
    ex = Example(seq, aux, labels, index, depth=2)
    # step 0, origin t: token x[t+1], label y[t+1]
    assert ex.tokens[0].tolist() == seq[1:].tolist()
    assert ex.labels[0][0] == IGNORE and ex.labels[0][1] == index[7]
    # step 1 counts only where x[t+2] was the target's greedy token after x[..t+1]
    assert ex.labels[1][0] == IGNORE  # x[2]=3 but y[1] unknown (prompt)
    assert ex.labels[1][1] == index[3]  # x[3]=7 == y[2]=7, label y[3]=3


def test_ttt_loss_trains_a_real_draft_layer():
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=16, target_hidden_size=16, intermediate_size=32, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB)
    draft = Eagle3Draft(cfg, nn.Embedding(VOCAB, 16))
    seq, aux, labels = _data()
    d2t, t2d = build_vocab([(seq, aux, labels)], DRAFT_VOCAB, VOCAB, EOS)
    index = torch.full((VOCAB,), -1, dtype=torch.int64)
    index[t2d.nonzero()[:, 0]] = torch.arange(DRAFT_VOCAB)
    batch = [Example(seq, aux, labels, index, depth=3)]
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
