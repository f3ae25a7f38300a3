"""Train the reference EAGLE-3 head by self-distillation: ``python -m specscope.engine.train``.

1. The target answers the ~1,200 training prompts (``prompts.train_prompts``; 70% of batches greedy,
   30% sampled for variety), batched 96 at a time.
2. The same generation pass captures the aux hidden states (entering layers ``aux_layer_ids``), the
   target's greedy token at every generated position (labels are always the target's own argmax, so
   sampled text is labelled exactly as the target would continue it) and its top-32 logits there.
3. The draft vocabulary is the most frequent label tokens; ``d2t`` offsets and ``t2d`` follow
   (docs/design.md, "EAGLE-3 conventions").
4. The head starts from the target's own (tied) output-embedding rows of the draft vocabulary and its
   final norm, then trains with training-time test (EAGLE-3): step 0 reads the fused target features, steps
   1.. read the draft's own output hidden state; step j's queries attend causally to step-0 keys and to
   the same origin's keys of steps 1..j (the attention a chained draft sees at inference). Each step's
   loss mixes cross entropy on the greedy token with cross entropy on the target's top-32 distribution
   (soft targets: distillation carries more per token than one label, which matters with ~130k tokens).
5. Per-dimension feature scaling (a few aux dimensions are ~15x larger) is folded into ``fc.weight``
   when saving, so the shipped checkpoint reads raw target features.

Everything is seeded. On this project's 2-core CPU generation takes ~14 min (``--data-cache`` keeps it
for reruns; ``training.json`` still reports it) and training ``--train-minutes`` (25): ~39 min in all.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specscope.engine.checkpoint import DEFAULT_DRAFT_DIR, save_draft
from specscope.engine.draft import DraftConfig, Eagle3Draft
from specscope.engine.prompts import train_prompts
from specscope.engine.target import load_target

IGNORE = -100
TOP_K = 32  # target logits kept per generated position for the soft (distillation) targets


@dataclass
class Sequence:
    """One generated answer with what training reads from it.

    ``tokens`` (L,) prompt + answer ids; ``aux`` (L-1, n_aux*H) float16, the aux hidden states at every
    fed position; ``labels`` (L,) the target's greedy token after ``tokens[..t]`` (-1 inside the prompt
    and after the last token); ``top_logits`` / ``top_ids`` (n_ans, K) the target's K largest logits at
    answer positions ``first .. first+n_ans-1`` (``first`` = index of the last prompt token).
    """

    tokens: torch.Tensor
    aux: torch.Tensor
    labels: torch.Tensor
    first: int
    top_logits: torch.Tensor
    top_ids: torch.Tensor


def _log(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


def generate_data(model, tokenizer, prompts, aux_ids, max_new_tokens: int, batch: int,
                  sample_share: float, seed: int, top_k: int = TOP_K) -> list[Sequence]:
    """The target answers each chat-formatted prompt; the same pass records what training needs.

    Returns one :class:`Sequence` per prompt. Features and soft targets come from the generation pass
    itself (no second target forward).
    """
    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    data = []
    for start in range(0, len(prompts), batch):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts[start:start + batch]]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        sample = torch.rand(1, generator=gen).item() < sample_share
        torch.manual_seed(seed + start)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=sample,
                                 temperature=0.8 if sample else None, top_p=0.95 if sample else None,
                                 top_k=None, pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True,
                                 output_hidden_states=True, output_logits=True)
        # hidden_states[s][i]: (B, T_s, H) entering layer i at step s (T_0 = padded prompt width, then 1)
        aux = torch.cat([torch.cat([step[i] for step in out.hidden_states], dim=1) for i in aux_ids], -1)
        top = [lg.topk(top_k, dim=-1) for lg in out.logits]
        greedy = torch.stack([t.indices[:, 0] for t in top], dim=1)  # (B, steps)
        top_logits = torch.stack([t.values for t in top], dim=1).to(torch.float16)  # (B, steps, K)
        top_ids = torch.stack([t.indices for t in top], dim=1).to(torch.int32)  # (B, steps, K)
        width = enc["input_ids"].shape[1]
        for r, mask in enumerate(enc["attention_mask"]):
            answer = out.sequences[r, width:]
            stop = (answer == eos).nonzero()
            n_ans = int(stop[0]) + 1 if len(stop) else len(answer)
            pad = int((~mask.bool()).sum())
            tokens = out.sequences[r, pad:width + n_ans]  # (L,)
            feats = aux[r, pad:width + n_ans - 1]  # (L-1, n_aux*H): the last token was never fed
            labels = torch.full((len(tokens),), -1, dtype=torch.int64)
            labels[width - pad - 1: len(tokens) - 1] = greedy[r, :n_ans]
            data.append(Sequence(tokens, feats.to(torch.float16), labels, width - pad - 1,
                                 top_logits[r, :n_ans].clone(), top_ids[r, :n_ans].clone()))
        print(f"  generated {len(data)}/{len(prompts)} sequences", flush=True)
    return data


def save_data(path: Path, data: list[Sequence], generation_s: float) -> None:
    """Write generated sequences (plain tensors, loadable with ``weights_only``) and the wall time
    (s) their generation took, so a rerun's report still states the full cost."""
    fields = {f: [getattr(s, f) for s in data] for f in Sequence.__dataclass_fields__}
    torch.save({**fields, "generation_s": generation_s}, path)


def load_data(path: Path) -> tuple[list[Sequence], float]:
    """Inverse of :func:`save_data`: ``(sequences, generation wall time in s)``."""
    blob = torch.load(path)
    names = list(Sequence.__dataclass_fields__)
    return [Sequence(*row) for row in zip(*(blob[f] for f in names))], float(blob["generation_s"])


def build_vocab(feats: list[Sequence], draft_vocab: int, vocab: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Most frequent label tokens -> (d2t offsets int64 [draft_vocab], t2d bool [vocab])."""
    counts = Counter()
    for seq in feats:
        counts.update(seq.labels[seq.labels >= 0].tolist())
    chosen = {eos} | {t for t, _ in counts.most_common(draft_vocab)}
    chosen = sorted(chosen)[:draft_vocab] if len(chosen) > draft_vocab else sorted(chosen)
    extra = [t for t in range(vocab) if t not in set(chosen)][: draft_vocab - len(chosen)]
    target_ids = torch.tensor(sorted(chosen + extra), dtype=torch.int64)  # (draft_vocab,)
    d2t = target_ids - torch.arange(draft_vocab, dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t, t2d


class Example:
    """One sequence laid out for training-time test with ``depth`` steps.

    For origin t (0 <= t < L-1) and step j: token x[t+1+j] at position t+1+j, label y[t+1+j] (draft
    id or IGNORE) and the target's top-K logits there (``soft_logits`` (N, K), ``soft_ids`` (N, K) draft
    ids, -1 where the token is outside the draft vocabulary or no logits exist). Steps j >= 1 only count
    where the text followed the target's greedy path, since at inference the chained draft's earlier
    guesses are assumed right.
    """

    def __init__(self, seq: Sequence, t2d_index: torch.Tensor, depth: int) -> None:
        tokens, labels = seq.tokens, seq.labels
        n = len(tokens) - 1
        self.aux = seq.aux  # (N, n_aux*H), N = L - 1 origins
        self.tokens, self.labels, self.soft_logits, self.soft_ids = [], [], [], []
        greedy_ok = torch.ones(n, dtype=torch.bool)
        for j in range(depth):
            idx = torch.arange(n) + 1 + j
            inside = idx < len(tokens)
            idx_c = idx.clamp(max=len(tokens) - 1)
            if j > 0:  # x[t+1+j] must be the target's greedy token after x[..t+j]
                greedy_ok &= inside & (tokens[idx_c] == labels[(idx_c - 1)])
            known = labels[idx_c] >= 0
            lab = torch.where(known, t2d_index[labels[idx_c].clamp(min=0)], torch.full_like(idx_c, -1))
            keep = inside & greedy_ok & (lab >= 0)
            self.tokens.append(tokens[idx_c])
            self.labels.append(torch.where(keep, lab, torch.full_like(lab, IGNORE)))
            row = (idx_c - seq.first).clamp(0, len(seq.top_ids) - 1)
            soft_ids = t2d_index[seq.top_ids[row].long()]  # (N, K)
            self.soft_ids.append(torch.where(keep[:, None], soft_ids, torch.full_like(soft_ids, -1)))
            self.soft_logits.append(seq.top_logits[row])
def _pad(tensors, value):
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)


def _soft_targets(batch: list[Example], j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``(soft_logits (B, N, K) float32, soft_ids (B, N, K) int64)`` for step ``j``."""
    return (_pad([e.soft_logits[j] for e in batch], 0.0).float(), _pad([e.soft_ids[j] for e in batch], -1))


def _soft_cross_entropy(logits: torch.Tensor, top_logits: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
    """Cross entropy of the draft (``logits`` (B, N, V_draft)) against the target's distribution
    renormalised over its top-K tokens that lie in the draft vocabulary; rows with none are skipped."""
    valid = top_ids >= 0  # (B, N, K)
    target = torch.softmax(top_logits.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num(0.0)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, top_ids.clamp(min=0))  # (B, N, K)
    rows = valid.any(-1)
    return -(target * logp).sum(-1)[rows].mean() if rows.any() else logits.sum() * 0.0


def ttt_loss(draft: Eagle3Draft, batch: list[Example], scale: torch.Tensor, depth: int,
             decay: float = 0.8, soft_weight: float = 0.5) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Training-time-test loss over a padded batch: per step, ``(1 - soft_weight)`` x cross entropy on
    the target's greedy token + ``soft_weight`` x cross entropy on its top-K distribution (distillation),
    weighted ``decay**j``. Returns (loss, [(correct, counted)] per step)."""
    aux = _pad([e.aux for e in batch], 0.0).float() * scale  # (B, N, n_aux*H)
    b, n, _ = aux.shape
    valid_keys = _pad([torch.ones(len(e.aux), dtype=torch.bool) for e in batch], False)  # (B, N)
    layer, attn = draft.midlayer, draft.midlayer.self_attn
    causal = torch.ones(n, n, dtype=torch.bool).tril() & valid_keys[:, None, None, :]  # (B, 1, N, N)
    hidden = draft.fc(aux)  # (B, N, H)
    keys, values, loss, stats = [], [], 0.0, []
    for j in range(depth):
        tokens = _pad([e.tokens[j] for e in batch], 0)
        labels = _pad([e.labels[j] for e in batch], IGNORE)
        positions = torch.arange(n)[None].expand(b, n) + 1 + j
        embeds = draft.embed_tokens(tokens)
        x = layer.attn_input(embeds, hidden)  # (B, N, 2H)
        cos, sin = draft.rope(positions, x)
        q, k, v = attn.qkv(x, cos, sin)  # q (B, h, N, d); k, v (B, kvh, N, d)
        rep = attn.heads // attn.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        keys.append(k)
        values.append(v)
        scores = [(q @ keys[0].transpose(-1, -2)).masked_fill(~causal, float("-inf"))]  # (B, h, N, N)
        scores += [(q * keys[i]).sum(-1, keepdim=True) for i in range(1, j + 1)]  # (B, h, N, 1) each
        probs = torch.softmax(torch.cat(scores, -1) / math.sqrt(attn.head_dim), dim=-1)
        out = probs[..., :n] @ values[0]
        for i in range(1, j + 1):
            out = out + probs[..., n + i - 1: n + i] * values[i]
        hidden = layer.finish(attn.output(out), hidden)  # (B, N, H)
        logits = draft.lm_head(draft.norm(hidden))  # (B, N, draft_vocab)
        soft = _soft_targets(batch, j)
        step_loss = ((1 - soft_weight) * F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
                     + soft_weight * _soft_cross_entropy(logits, *soft))
        loss = loss + (decay ** j) * step_loss
        counted = labels != IGNORE
        stats.append((int((logits.argmax(-1) == labels)[counted].sum()), int(counted.sum())))
    return loss, stats


def main(argv: list[str] | None = None) -> int:
    """Run the whole pipeline and write the checkpoint (default: the shipped asset folder)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_DRAFT_DIR)
    ap.add_argument("--prompts", type=int, default=None, help="use only the first N training prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gen-batch", type=int, default=96)
    ap.add_argument("--sample-share", type=float, default=0.3)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=3, help="training-time-test steps")
    ap.add_argument("--train-minutes", type=float, default=25.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--soft-weight", type=float, default=0.5, help="share of the top-K distillation loss")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-cache", type=Path, default=None, help="reuse/save generated data here")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    torch.manual_seed(args.seed)
    target, tokenizer = load_target()
    cfg = DraftConfig(draft_vocab_size=args.draft_vocab)
    aux_ids = list(cfg.aux_layer_ids)

    if args.data_cache and args.data_cache.exists():
        data, generation_s = load_data(args.data_cache)
        _log(f"loaded {len(data)} sequences from {args.data_cache} (generated in {generation_s:.0f} s)", t0)
    else:
        data = generate_data(target, tokenizer, train_prompts()[: args.prompts], aux_ids, args.max_new_tokens,
                             args.gen_batch, args.sample_share, args.seed)
        generation_s = time.time() - t0
        _log(f"generated {len(data)} sequences, {sum(len(s.tokens) for s in data)} tokens with features", t0)
        if args.data_cache:
            save_data(args.data_cache, data, generation_s)
    data_ready = time.time()

    d2t, t2d = build_vocab(data, cfg.draft_vocab_size, cfg.vocab_size, tokenizer.eos_token_id)
    t2d_index = torch.full((cfg.vocab_size,), -1, dtype=torch.int64)
    t2d_index[t2d.nonzero()[:, 0]] = torch.arange(cfg.draft_vocab_size)
    examples = [Example(seq, t2d_index, args.depth) for seq in data]
    n_val = max(1, len(examples) // 20)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(examples), generator=gen).tolist()
    val = [examples[i] for i in order[:n_val]]
    train = [examples[i] for i in order[n_val:]]
    all_aux = torch.cat([e.aux for e in train]).float()
    scale = 1.0 / all_aux.std(0).clamp(min=1e-3)  # (n_aux*H,)
    known = sum(int((seq.labels[1:] >= 0).sum()) for seq in data)  # positions with a target label
    coverage = float(sum(int((e.labels[0] != IGNORE).sum()) for e in examples) / max(known, 1))
    _log(f"train {len(train)} seqs / {sum(len(e.aux) for e in train)} positions; val {len(val)}; "
         f"draft vocab covers {coverage:.1%} of the labels", t0)

    draft = Eagle3Draft(cfg, target.get_input_embeddings())
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    with torch.no_grad():  # start the head where the target's own (tied) head is, for the draft vocab
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[t2d])
        draft.norm.weight.copy_(target.model.norm.weight)
    for p in target.parameters():
        p.requires_grad_(False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    budget_s = args.train_minutes * 60
    train_start = time.time()
    best = (-1.0, None)
    epoch = 0
    history = []
    while time.time() - train_start < budget_s:
        epoch += 1
        draft.train()
        perm = torch.randperm(len(train), generator=gen).tolist()
        batches = [sorted((train[i] for i in perm[s:s + args.batch]), key=lambda e: len(e.aux))
                   for s in range(0, len(perm), args.batch)]
        total = 0.0
        for batch in batches:
            frac = min(1.0, (time.time() - train_start) / budget_s)
            for group in opt.param_groups:
                group["lr"] = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
            loss, _ = ttt_loss(draft, batch, scale, args.depth, soft_weight=args.soft_weight)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            total += loss.item()
            if time.time() - train_start > budget_s:
                break
        acc = evaluate(draft, val, scale, args.depth)
        history.append({"epoch": epoch, "loss": total / len(batches), "val_acc": acc})
        _log(f"epoch {epoch}: loss {total / len(batches):.3f}  val acc per step {acc}", t0)
        if acc[0] > best[0]:
            best = (acc[0], {k: v.clone() for k, v in draft.state_dict().items()})
    draft.load_state_dict(best[1])
    with torch.no_grad():
        draft.fc.weight.mul_(scale[None, :])  # fold feature scaling so the head reads raw features
    save_draft(args.out, draft)
    report = {"sequences": len(data), "tokens": int(sum(len(s.tokens) for s in data)),
              "answer_tokens": int(sum(len(s.top_ids) for s in data)), "epochs": epoch,
              "best_val_step0_acc": best[0], "draft_vocab_coverage": coverage, "history": history,
              "args": {k: str(v) for k, v in vars(args).items()}, "generation_s": round(generation_s, 1),
              "training_s": round(time.time() - train_start, 1),
              "wall_s": round(generation_s + time.time() - data_ready, 1)}
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    _log(f"saved {args.out} (best val step-0 accuracy {best[0]:.3f})", t0)
    return 0


def evaluate(draft: Eagle3Draft, val: list[Example], scale: torch.Tensor, depth: int) -> list[float]:
    """Top-1 accuracy per training-time-test step on held-back sequences (labels outside the draft
    vocabulary count as misses only through coverage, not here)."""
    draft.eval()
    totals = [[0, 0] for _ in range(depth)]
    with torch.no_grad():
        for s in range(0, len(val), 8):
            _, stats = ttt_loss(draft, val[s:s + 8], scale, depth)
            for t, (c, n) in zip(totals, stats):
                t[0] += c
                t[1] += n
    return [round(c / max(n, 1), 3) for c, n in totals]


if __name__ == "__main__":
    raise SystemExit(main())
