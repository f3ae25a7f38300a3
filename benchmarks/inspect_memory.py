"""Peak memory of `specscope inspect` on a ~2 GB sharded EAGLE-3 draft (Llama-3-8B-sized shapes).

Run: ``python -m benchmarks.inspect_memory [--keep DIR]``. Builds 4 bf16 shards plus
``model.safetensors.index.json`` in a temporary folder, then inspects it in a fresh subprocess and
prints that process's peak RSS (``ru_maxrss``) after imports and after the inspection, against the
checkpoint size. The inspection reads every value (non-finite / fp16 checks), in chunks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN, INTER, KV, VOCAB, DRAFT_VOCAB = 4096, 14336, 1024, 128256, 32000
SHARDS = {
    "model-00001-of-00004.safetensors": {"embed_tokens.weight": (VOCAB, HIDDEN)},
    "model-00002-of-00004.safetensors": {
        "lm_head.weight": (DRAFT_VOCAB, HIDDEN), "fc.weight": (HIDDEN, 3 * HIDDEN),
        "midlayer.self_attn.q_proj.weight": (HIDDEN, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": (KV, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": (KV, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": (HIDDEN, HIDDEN)},
    "model-00003-of-00004.safetensors": {
        "midlayer.mlp.gate_proj.weight": (INTER, HIDDEN), "midlayer.mlp.up_proj.weight": (INTER, HIDDEN)},
    "model-00004-of-00004.safetensors": {
        "midlayer.mlp.down_proj.weight": (HIDDEN, INTER), "midlayer.input_layernorm.weight": (HIDDEN,),
        "midlayer.hidden_norm.weight": (HIDDEN,), "midlayer.post_attention_layernorm.weight": (HIDDEN,),
        "norm.weight": (HIDDEN,)},
}
CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
          "intermediate_size": INTER, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
          "target_hidden_size": HIDDEN, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}

_PROBE = """
import json, resource, sys, time
from specscope.inspector import inspect_checkpoint
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
before, hwm_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, hwm()
t0 = time.perf_counter()
report = inspect_checkpoint(sys.argv[1], engine="sglang", serve_dtype="fp16")
print(json.dumps({"before_kib": before, "after_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "hwm_before_kib": hwm_before, "hwm_after_kib": hwm(),
                  "seconds": time.perf_counter() - t0, "codes": report.codes()}))
"""


def _weights(shape: tuple[int, ...], gen):
    import torch

    if len(shape) == 1:
        return 1.0 + 0.05 * torch.randn(shape, generator=gen).to(torch.bfloat16)
    out = torch.empty(shape, dtype=torch.bfloat16)
    step = max(1, 2**24 // shape[1])
    for start in range(0, shape[0], step):  # row blocks: never a full fp32 copy of a 1 GB table
        out[start:start + step] = torch.randn(out[start:start + step].shape, generator=gen) * 0.03
    return out


def build(folder: Path) -> int:
    """Write the sharded checkpoint into ``folder``; returns its tensor bytes."""
    import torch  # only in the build subprocess: the parent stays small (ru_maxrss survives exec)
    from safetensors.torch import save_file

    gen, weight_map, total = torch.Generator().manual_seed(0), {}, 0
    for shard, tensors in SHARDS.items():
        data = {name: _weights(shape, gen) for name, shape in tensors.items()}
        if shard.startswith("model-00004"):
            ids = torch.sort(torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB]).values
            data["d2t"] = ids - torch.arange(DRAFT_VOCAB)
            data["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, ids, True)
        save_file(data, str(folder / shard))
        total += sum(t.numel() * t.element_size() for t in data.values())
        weight_map.update({name: shard for name in data})
        del data
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return total


def _last_json(argv: list[str]) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(folder: Path) -> dict:
    """Inspect ``folder`` in a fresh interpreter: ru_maxrss and VmHWM (KiB) before and after."""
    return _last_json([sys.executable, "-c", _PROBE, str(folder)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build into this folder and keep it")
    parser.add_argument("--build-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        print(json.dumps({"bytes": build(args.build_only)}))
        return
    with tempfile.TemporaryDirectory(prefix="specscope-inspect-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        size = _last_json([sys.executable, "-m", "benchmarks.inspect_memory", "--build-only", str(folder)])["bytes"]
        print(f"built {size / 2**30:.2f} GiB in {len(SHARDS)} shards in {time.perf_counter() - t0:.1f} s")
        r = measure(folder)
    delta = (r["after_kib"] - r["before_kib"]) * 1024
    print(f"inspection: {r['seconds']:.1f} s, findings {r['codes']}")
    print(f"ru_maxrss after imports {r['before_kib'] / 1024:.0f} MiB, after inspection "
          f"{r['after_kib'] / 1024:.0f} MiB (VmHWM {r['hwm_before_kib'] / 1024:.0f} -> "
          f"{r['hwm_after_kib'] / 1024:.0f} MiB)")
    print(f"peak RSS delta {delta / 2**20:.0f} MiB = {100 * delta / size:.1f}% of the "
          f"{size / 2**20:.0f} MiB checkpoint")


if __name__ == "__main__":
    main()
