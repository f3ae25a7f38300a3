"""A quantized GGUF rewritten with every tensor dequantized to float32, metadata unchanged, with the
PyPI ``gguf`` package.

Why: llama.cpp serving a Q4_1 GGUF does not compute with the float32 weights the same file gives
transformers (and so vLLM and the reference engine, which serve the dequantized copy): its Q4_1 matrix
products quantize their activations too, so the target's hidden states, greedy tokens and the
acceptance of a draft trained on float32 states differ (docs/engines.md, "llama.cpp and vLLM on the
same prompts"). Served from this file, llama.cpp's target computes on the same weights in float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_dequantized_gguf(source: str | Path, out: str | Path) -> Path:
    """Write ``source`` (a GGUF, any of the ``gguf`` package's quantization types) to ``out`` with every
    tensor as float32 and ``general.file_type`` 0 (all F32); return ``out``.

    Raises:
        OSError: a file cannot be read or written.
        NotImplementedError: a tensor type the ``gguf`` package cannot dequantize.
    """
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":  # written by the writer itself
            continue
        if name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        writer.add_key_value(name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        writer.add_tensor(tensor.name, dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)
