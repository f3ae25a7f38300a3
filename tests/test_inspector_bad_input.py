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


@pytest.mark.parametrize("key, value, needle", [
    ("vocab_size", "NaN", "nan is not a whole number"), ("vocab_size", "1e400", "inf is not a whole number"),
    ("eagle_aux_hidden_state_layer_ids", "[2.5, 15, 27]", "2.5 is not a whole number"),
    ("eagle_aux_hidden_state_layer_ids", "[Infinity, 15, 27]", "inf is not a whole number"),
    ("initializer_range", '"abc"', "initializer_range must be a finite number"),
])
def test_config_numbers_no_engine_can_size_by(copy, key, value, needle, capsys):
    text = (copy / "config.json").read_text().rstrip().rstrip("}")
    (copy / "config.json").write_text(f'{text}, "{key}": {value}}}')  # Python's json reads NaN, Infinity
    _fail([str(copy)], capsys, needle)


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


def _sparse_checkpoint(folder: Path, key: str, dtype: str, shape: list[int], item: int) -> Path:
    """A safetensors file whose header declares ``shape`` and whose data is one hole: a few KB on
    disk, the declared size in length (safetensors checks that the data covers the length)."""
    nbytes = item
    for d in shape:
        nbytes *= d
    header = json.dumps({key: {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    path = folder / "model.safetensors"
    with path.open("wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + nbytes)
    return path


@pytest.mark.parametrize("key, dtype, shape, item", [
    ("d2t", "I64", [2**27], 8),  # 1 GiB of d2t (inspect peaked at 7.5 GB)
    ("lm_head.weight", "BF16", [2**20, 2**19], 2),  # 1 TiB (ran > 60 s)
])
def test_sparse_checkpoint_declaring_huge_tensors(key, dtype, shape, item, copy, tmp_path) -> None:
    """Refused from its header, before any value is read: one line, exit 2, little memory."""
    _sparse_checkpoint(copy, key, dtype, shape, item)
    # VmHWM: this process's peak resident memory (ru_maxrss would carry the pytest parent's over exec)
    script = ("import re, sys\nfrom specscope.cli import main\ncode = main(['inspect', sys.argv[1]])\n"
              "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
              "print(code, int(hwm) // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(copy)], capture_output=True, text=True, timeout=120)
    code, peak_mib = proc.stdout.split()
    assert code == "2" and proc.stderr.count("\n") == 1 and "a sparse file" in proc.stderr, proc.stderr
    assert int(peak_mib) < 1024, proc.stdout


def test_vocab_map_larger_than_any_vocabulary(copy, capsys) -> None:
    """A real (not sparse) d2t of 5M entries, 40 MB: refused from its declared shape, not loaded."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(copy / "model.safetensors"))
    tensors["d2t"] = np.zeros(5 * 2**20, dtype=np.int64)
    save_file(tensors, str(copy / "model.safetensors"))
    _fail([str(copy)], capsys, "more than the 33,554,432 such a tensor can be")
