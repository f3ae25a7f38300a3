"""Unusable input: exit 2 with one clear line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import struct
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


# -- hostile files: each one line and exit 2, no hang, nothing raw on the terminal -----------------

def _inspect_subprocess(*argv: str) -> subprocess.CompletedProcess:
    """The CLI in its own process: a regression that hangs (a pipe waited on, a count looped over)
    fails the test at the timeout instead of stalling the suite."""
    return subprocess.run([sys.executable, "-m", "specscope", "inspect", *argv], capture_output=True,
                          text=True, timeout=120)


def _append_to_config(folder: Path, key: str, value_text: str) -> None:
    text = (folder / "config.json").read_text().rstrip().rstrip("}")
    (folder / "config.json").write_text(f'{text}, "{key}": {value_text}}}')


@pytest.mark.parametrize("key, depth, json_out", [
    ("a", 100_000, False),  # json.loads itself ran out of stack
    ("norm_before_fc", 900, True),  # read fine; the --json writer then ran out of stack
    ("norm_before_fc", 900, False),
])
def test_config_nested_too_deep(copy, key, depth, json_out, capsys):
    _append_to_config(copy, key, "[" * depth + "]" * depth)
    _fail([str(copy), *(["--json"] if json_out else [])], capsys, "nests its values more than 64 levels deep")


def test_config_integer_past_pythons_digit_limit(copy, capsys):
    _append_to_config(copy, "vocab_size", "9" * 5000)
    _fail([str(copy)], capsys, "holds an integer of more than 4,300 digits")


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "rope_theta", "initializer_range"])
def test_config_numbers_past_any_size(copy, key, capsys):
    """4,000 digits: readable, but no count or float; sizes derived from it would not even print."""
    _append_to_config(copy, key, "9" * 4000)
    _fail([str(copy)], capsys, "is out of range")


def test_zero_element_tensor_with_huge_dimensions(tmp_path, capsys):
    header = json.dumps({"lm_head.weight": {"dtype": "F32", "shape": [0, 2**62, 2**62],
                                            "data_offsets": [0, 0]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    _fail([str(tmp_path)], capsys, "more elements than any array can hold")


@pytest.mark.parametrize("name, extra", [
    ("model.safetensors", []), ("config.json", []), ("model.safetensors.index.json", []),
    ("target.json", ["--target-config"]), ("target.gguf", ["--target"]),
])
def test_a_pipe_in_place_of_a_file_is_refused_not_waited_on(copy, name, extra):
    """Nothing writes to the pipe: opening it for reading would block for ever."""
    fifo = copy / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    done = _inspect_subprocess(str(copy), *extra, *([str(fifo)] if extra else []))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1 and f"{fifo} is not a regular file" in done.stderr


def test_a_pipe_given_as_the_checkpoint(tmp_path):
    os.mkfifo(tmp_path / "draft.safetensors")
    done = _inspect_subprocess(str(tmp_path / "draft.safetensors"))
    assert done.returncode == 2 and "neither a folder nor a regular file" in done.stderr


def _gguf_header(kv_count: int, tensor_count: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count)


@pytest.mark.parametrize("blob, needle", [
    # a 49-byte file declaring a 2**62-item array of uint8 (GGUFReader looped over it for ever)
    (_gguf_header(1) + struct.pack("<Q", 1) + b"x" + struct.pack("<IIQ", 9, 0, 2**62), "past the 2,097,152"),
    # 2**62 keys (GGUFReader raised IndexError past the end)
    (_gguf_header(2**62), "past the 2,097,152"),
    # a key longer than the file
    (_gguf_header(1) + struct.pack("<Q", 2**40) + b"x", "declares a key past its end"),
    # 1,000 string items promised, none there
    (_gguf_header(1) + struct.pack("<Q", 1) + b"x" + struct.pack("<IIQ", 9, 8, 1000), "past its end"),
    # arrays nested four deep
    (_gguf_header(1) + struct.pack("<Q", 1) + b"x" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 3
     + struct.pack("<IQ", 0, 0), "deeper than 3 levels"),
    (_gguf_header(1) + struct.pack("<Q", 1) + b"x" + struct.pack("<I", 13), "unknown value type 13"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    (b"GGUF\x03\x00", "too short"),
])
def test_crafted_gguf_target(copy, tmp_path, blob, needle):
    (tmp_path / "t.gguf").write_bytes(blob)
    done = _inspect_subprocess(str(copy), "--target", str(tmp_path / "t.gguf"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr


def test_gguf_target_keys_read_as_config_keys(copy, tmp_path, capsys):
    """A well-formed GGUF (written by the gguf package) with RoPE scaling and a sliding window: the
    settings come through; a per-layer head count (an array) is no count and is not used."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_embedding_length(64)
    writer.add_block_count(4)
    writer.add_context_length(4096)
    writer.add_array("llama.attention.head_count", [4, 4, 4, 4])
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_orig_ctx_len(1024)
    writer.add_sliding_window(512)
    writer.add_token_list([f"t{i}" for i in range(1000)])
    writer.add_tensor("token_embd.weight", np.zeros((1000, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from specscope.inspector import load_target_config

    target = load_target_config(tmp_path / "t.gguf")
    assert (target.hidden_size, target.vocab_size, target.num_hidden_layers, target.head_dim) == (64, 1000, 4, None)
    assert (target.rope_theta, target.rope_scaling, target.max_position_embeddings) == (
        500000.0, ("yarn", 4.0, 1024), 4096)
    assert target.sliding_window == 512 and target.tie_word_embeddings and target.architectures == ("llama",)


ESC_NAME = "midlayer.\x1b[2J\x1b]0;pwned\x07\nx"


def test_control_characters_in_tensor_names_reach_no_terminal(tmp_path, capsys):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({ESC_NAME: np.zeros(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    assert main(["inspect", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert not set(out) & {"\x1b", "\x07"} and "dropped  midlayer.\\x1b[2J\\x1b]0;pwned\\x07\\x0ax\n" in out
    assert main(["inspect", str(tmp_path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["keys"]["dropped"] == [ESC_NAME]  # JSON stays JSON


def test_control_characters_in_an_error_line(tmp_path, capsys):
    header = json.dumps({ESC_NAME: {"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    _fail([str(tmp_path)], capsys, "tensor midlayer.\\x1b[2J\\x1b]0;pwned\\x07\\x0ax of")


def test_a_name_too_long_for_the_file_system(tmp_path, capsys):
    _fail([str(tmp_path / ("a" * 300))], capsys, "File name too long")
    _fail([str(tmp_path), "--target", str(tmp_path / ("a" * 300))], capsys, "File name too long")
