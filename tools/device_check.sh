#!/usr/bin/env bash
# The GPU checks of CUDA-graph replay in one go, for a task lent a device machine (a few minutes on an
# H200; docs/design.md, "Where the engines let us in", CUDA graphs):
#   run(command="bash tools/device_check.sh", timeout_s=540)
# 1. tests/test_cuda_graphs.py: a hooked target and draft captured with torch.cuda.graph and replayed;
#    the capture layers, replayed calls and provenance read back from the static buffer (healthy and a
#    wrong captured layer, eager hooks and the compiled op), and shape-only hooks plus the losslessness
#    audit on the eager step path, all under torch.cuda.set_sync_debug_mode("error"); and a draft-only
#    instrument, which has no buffer: its replays stay unseen (graph mode mixed);
# 2. tools/device_check.py: the same at a realistic size (hidden 4096, 32 layers, 64 tokens, bf16):
#    replay time bare vs instrumented, status poll time, the evidence read back.
# Logs and a JSON summary land in $OUT (the device tool's folder) or /tmp/specscope-device.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
out=${OUT:-/tmp/specscope-device}
mkdir -p "$out"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name())'
status=0
# --noconftest: the suite's conftest opens SQLAlchemy stores, which these tests do not use (and the
# device image lacks SQLAlchemy); -rs lists skips, which here mean the device was not seen.
timeout 360 "$py" -m pytest -q -rs -p no:cacheprovider --noconftest tests/test_cuda_graphs.py \
    tests/test_instrumentation.py::test_cuda_graph_capture_is_tagged_and_replay_is_invisible 2>&1 \
    | tee "$out/pytest.log" || status=1
if grep -q "skipped" "$out/pytest.log"; then status=1; fi
timeout 150 "$py" tools/device_check.py --out "$out/device_check.json" 2>&1 | tee "$out/device_check.log" || status=1
echo "specscope device check: $([ "$status" = 0 ] && echo PASSED || echo FAILED)"
exit "$status"
