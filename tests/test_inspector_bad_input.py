"""Unusable input: exit 2 with one clear line on stderr, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specscope.cli import main



def _fail(argv: list[str], capsys, needle: str) -> None:
    rc = main(["inspect", *argv])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and needle in lines[0]
    assert captured.out == ""


@pytest.fixture
def copy(tmp_path, ok_eagle3: Path) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(ok_eagle3, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


def test_missing_path(tmp_path, capsys):
    _fail([str(tmp_path / "nope")], capsys, "no such checkpoint")


def test_truncated_file(copy, capsys):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) // 2])
    _fail([str(copy)], capsys, "not a readable safetensors file")


def test_not_safetensors(tmp_path, capsys):
    bogus = tmp_path / "weights.safetensors"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not safetensors")
    _fail([str(bogus)], capsys, "not a readable safetensors file")


def test_config_not_json(copy, capsys):
    (copy / "config.json").write_text("{hidden_size: 64,")
    _fail([str(copy)], capsys, "is not valid JSON")


def test_index_names_missing_shard(copy, capsys):
    (copy / "model.safetensors").rename(copy / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"fc.weight": "model-00001-of-00002.safetensors",
                            "norm.weight": "model-00002-of-00002.safetensors"}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    _fail([str(copy)], capsys, "missing shard model-00002-of-00002.safetensors")


def test_empty_folder(tmp_path, capsys):
    _fail([str(tmp_path)], capsys, "no model.safetensors")


def test_bad_target_config(copy, tmp_path, capsys):
    (tmp_path / "target.json").write_text("not json")
    _fail([str(copy), "--target-config", str(tmp_path / "target.json")], capsys, "target config")


def test_unknown_engine_is_an_argument_error(copy, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["inspect", str(copy), "--engine", "tgi"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_subprocess_bad_input_has_no_traceback(tmp_path):
    script = Path(sys.executable).with_name("specscope")
    proc = subprocess.run([str(script), "inspect", str(tmp_path / "missing")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
