"""The base install is what an inference server embeds: a fresh virtualenv with ``pip install .`` (no
extras) runs Tracer + Collector + doctor + inspect, and the UI and reference-engine packages are not
importable there. Torch comes first, pinned to the local CPU build (as the Makefile does)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import importlib.util, sys, tempfile
    from pathlib import Path
    import torch
    from torch import nn
    from specscope import Collector, RunConfig, Tracer, diagnose, inspect_checkpoint, instrument, open_store

    for absent in ("streamlit", "plotly", "pandas", "transformers", "accelerate"):
        assert importlib.util.find_spec(absent) is None, absent + " came with the base install"

    class Draft(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * 8, 8, bias=False)
        def forward(self, input_ids, hidden_states):
            return self.fc(hidden_states) if hidden_states.shape[-1] != 8 else hidden_states

    db = str(Path(tempfile.mkdtemp()) / "base.db")
    config = RunConfig(aux_layer_ids_resolved=(0, 1, 2), target_hidden_size=8, expected_fused_width=24,
                       k=2, num_target_layers=4)
    with Collector(db) as collector:
        tracer = Tracer(collector, engine="base", engine_version="0", target_model="t", draft_model="d",
                        config=config)
        draft = Draft()
        instrument(tracer, draft=draft, modules=["fc"], draft_hidden_size=8)
        tracer.start_request("r", prompt_tokens=3)
        for _ in range(20):
            draft(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 8))  # never fused: AUX_NOT_FUSED
            tracer.record_verify("r", proposed=2, accepted=0)
        tracer.finish_request("r", output_tokens=20)
        tracer.close()
    with open_store(db, read_only=True) as store:
        codes = diagnose(store).codes()
    assert "AUX_NOT_FUSED" in codes and "ACCEPT_COLLAPSE" in codes, codes
    report = inspect_checkpoint(sys.argv[1], engine="vllm")
    assert any(f.code == "CKPT_FORMAT" for f in report.findings)
    print("base install ok", sorted(set(codes)))
''')


def test_base_install_runs_tracer_collector_doctor_inspect(tmp_path, ok_eagle3):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=900)
    build = tmp_path / "src"  # a copy without the checkout's .venv and caches keeps the build quick
    shutil.copytree(ROOT, build, ignore=shutil.ignore_patterns(".venv", ".git", "*.db", "__pycache__",
                                                                ".pytest_cache", "*.egg-info"))
    subprocess.run([*pip, str(build)], check=True, timeout=900)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", SCRIPT, str(ok_eagle3)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "base install ok" in out.stdout
    cli = subprocess.run([str(venv / "bin" / "specscope"), "--version"], capture_output=True, text=True)
    assert cli.returncode == 0 and cli.stdout.startswith("specscope ")
