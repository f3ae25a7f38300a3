"""Property-based fuzzing (hypothesis) of what users hand specscope: every reader of user files and the
public API's inputs. Each input gets a clear outcome (a result, or one line and exit 2 on the CLI, or a
SpecscopeError from the API), never a traceback, and nothing already stored changes.

Example counts are small (a few seconds per property); the seeds are derandomized so a failure
reproduces.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from _dashboard_traces import trace, write_store
from _list_sink import ListSink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specscope import events as ev
from specscope.cli import main
from specscope.collector import Collector
from specscope.errors import ConfigError, SpecscopeError
from specscope.instrumentation import Tracer
from specscope.storage import open_store

FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _cli(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process; (exit status, stderr). Any exception other than SystemExit escapes."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, err.getvalue()


def _assert_clear(code: int, err: str) -> None:
    assert "Traceback" not in err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("specscope"), err
    else:
        assert code in (0, 1), (code, err)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, ok_eagle3) -> Path:
    return ok_eagle3


@pytest.fixture(scope="module")
def store_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "store.db"
    write_store(path, [trace("fuzz-run", requests=2, steps=4)])
    with open_store(str(path)):
        pass  # checkpoint the WAL into the main file
    return path.read_bytes()


# -- safetensors checkpoints: header bytes, header length, truncation -----------------------------

@FUZZ
@given(data=st.data())
def test_mutated_safetensors_header(checkpoint: Path, data) -> None:
    blob = (checkpoint / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", blob[:8])[0]
    mutation = data.draw(st.sampled_from(["flip", "length", "truncate", "json"]))
    if mutation == "flip":
        at = data.draw(st.integers(8, 8 + header_len - 1))
        blob = blob[:at] + bytes([data.draw(st.integers(0, 255))]) + blob[at + 1:]
    elif mutation == "length":
        blob = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1))) + blob[8:]
    elif mutation == "truncate":
        blob = blob[:data.draw(st.integers(0, len(blob) - 1))]
    else:  # a header that is valid JSON of the wrong shape
        header = json.dumps(data.draw(st.dictionaries(st.text(max_size=8), st.one_of(
            st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
            st.fixed_dictionaries({"dtype": st.text(max_size=4), "shape": st.lists(st.integers(-2, 9), max_size=3),
                                   "data_offsets": st.lists(st.integers(-2, 99), max_size=3)})), max_size=3))).encode()
        blob = struct.pack("<Q", len(header)) + header + blob[8 + header_len:]
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(checkpoint / "config.json", folder)
        Path(folder, "model.safetensors").write_bytes(blob)
        _assert_clear(*_cli(["inspect", folder]))


@FUZZ
@given(index=st.one_of(
    st.binary(max_size=64),
    st.dictionaries(st.sampled_from(["weight_map", "metadata", "x"]), st.one_of(
        st.none(), st.integers(), st.text(max_size=6),
        st.dictionaries(st.text(max_size=12), st.one_of(st.text(max_size=20), st.integers(), st.none()),
                        max_size=4)), max_size=3).map(lambda d: json.dumps(d).encode())))
def test_mutated_shard_index(checkpoint: Path, index: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(checkpoint / "config.json", folder)
        shutil.copy(checkpoint / "model.safetensors", Path(folder, "model-00001-of-00001.safetensors"))
        Path(folder, "model.safetensors.index.json").write_bytes(index)
        _assert_clear(*_cli(["inspect", folder]))


@FUZZ
@given(config=st.dictionaries(st.sampled_from(
    ["hidden_size", "vocab_size", "draft_vocab_size", "num_hidden_layers", "eagle_config", "architectures",
     "torch_dtype", "tie_word_embeddings"]), st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8),
    st.lists(st.integers(-3, 40), max_size=4), st.dictionaries(st.text(max_size=30), st.integers(), max_size=2)),
    max_size=6))
def test_configs_with_wrong_types(checkpoint: Path, config: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(checkpoint / "model.safetensors", folder)
        original = json.loads((checkpoint / "config.json").read_text())
        Path(folder, "config.json").write_text(json.dumps({**original, **config}))
        Path(folder, "target.json").write_text(json.dumps(config))
        _assert_clear(*_cli(["inspect", folder]))
        _assert_clear(*_cli(["inspect", folder, "--target-config", str(Path(folder, "target.json"))]))


# -- GGUF targets: bytes flipped, counts and lengths overwritten, truncation ----------------------

@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    """A small well-formed GGUF target (the gguf package's writer): scalars, a string, a token list
    and a tensor record."""
    import gguf
    import numpy as np

    path = tmp_path_factory.mktemp("gguf") / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_rope_freq_base(10000.0)
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@FUZZ
@given(data=st.data())
def test_mutated_gguf_target(checkpoint: Path, gguf_bytes: bytes, data) -> None:
    metadata_end = gguf_bytes.index(b"token_embd.weight") + 64  # keys and the tensor record
    mutation = data.draw(st.sampled_from(["flip", "count", "truncate"]))
    at = data.draw(st.integers(0, metadata_end))
    if mutation == "flip":
        blob = gguf_bytes[:at] + bytes([data.draw(st.integers(0, 255))]) + gguf_bytes[at + 1:]
    elif mutation == "count":  # a length or count of up to 2**64 - 1 anywhere in the metadata
        blob = gguf_bytes[:at] + struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1))) + gguf_bytes[at + 8:]
    else:
        blob = gguf_bytes[:at]
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "t.gguf").write_bytes(blob)
        _assert_clear(*_cli(["inspect", str(checkpoint), "--target", str(Path(folder, "t.gguf"))]))


# -- stores: truncated and garbage SQLite files ---------------------------------------------------

@FUZZ
@given(data=st.data())
def test_truncated_and_garbage_stores(store_bytes: bytes, data) -> None:
    mutation = data.draw(st.sampled_from(["truncate", "garbage", "overwrite"]))
    if mutation == "truncate":
        blob = store_bytes[:data.draw(st.integers(0, len(store_bytes) - 1))]
    elif mutation == "garbage":
        blob = data.draw(st.binary(min_size=1, max_size=4096))
    else:
        at = data.draw(st.integers(0, len(store_bytes) - 16))
        blob = store_bytes[:at] + data.draw(st.binary(min_size=1, max_size=16)) + store_bytes[at + 16:]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "store.db")
        path.write_bytes(blob)
        _assert_clear(*_cli(["query", "--db", str(path), "SELECT COUNT(*) FROM verify_steps"]))
        _assert_clear(*_cli(["doctor", "--db", str(path)]))
        assert path.read_bytes() == blob  # read-only surfaces: nothing stored changed


# -- public API -------------------------------------------------------------------------------------

ANY = st.one_of(st.none(), st.booleans(), st.integers(-10, 100), st.floats(allow_nan=True), st.text(max_size=6),
                st.lists(st.integers(-1, 2), max_size=5), st.binary(max_size=4))


@FUZZ
@given(proposed=ANY, accepted=ANY, mask=ANY, emitted=ANY, request=st.sampled_from(["q", "other", 7]))
def test_record_verify_never_raises(proposed, accepted, mask, emitted, request) -> None:
    sink = ListSink()
    tracer = Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                    config=ev.RunConfig(aux_layer_ids_resolved=(1,), target_hidden_size=4, expected_fused_width=4,
                                        k=3, num_target_layers=2))
    tracer.start_request("q", 3)
    tracer.record_verify(request, proposed, accepted, mask, emitted=emitted)
    tracer.close()
    steps = sink.of(ev.VerifyStep)
    assert len(steps) + tracer.hook_errors == 1  # stored as valid, or counted
    for step in steps:
        assert 0 <= step.accepted <= step.proposed and len(step.mask()) == step.proposed


@FUZZ
@given(fields=st.fixed_dictionaries({}, optional={
    "aux_layer_ids_resolved": ANY, "target_hidden_size": ANY, "expected_fused_width": ANY, "k": ANY,
    "num_target_layers": ANY, "aux_layer_ids_configured": ANY, "topk": ANY, "num_draft_tokens": ANY,
    "dtype": ANY}))
def test_run_config_accepts_or_raises_config_error(fields: dict) -> None:
    values = dict(aux_layer_ids_resolved=(1, 2), target_hidden_size=4, expected_fused_width=8, k=3,
                  num_target_layers=4)
    try:
        config = ev.RunConfig(**{**values, **fields})
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert config.expected_fused_width == len(config.aux_layer_ids_resolved) * config.target_hidden_size
        json.dumps(config.to_dict())


@FUZZ
@given(capacity=ANY, batch_size=ANY, interval=ANY)
def test_collector_settings_accept_or_raise_config_error(tmp_path, capacity, batch_size, interval) -> None:
    try:
        collector = Collector(str(tmp_path / "c.db"), capacity=capacity, batch_size=batch_size,
                              flush_interval_s=interval)
    except ConfigError:
        return
    collector.close()


@FUZZ
@given(sql=st.text(max_size=40), url=st.one_of(st.just("ok"), st.text(max_size=30)))
def test_query_api_raises_only_store_errors(tmp_path, store_bytes: bytes, sql: str, url: str) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(store_bytes)
    try:
        with open_store(str(path) if url == "ok" else url, create=False, read_only=True) as store:
            store.query(sql, timeout_s=0.5)
    except SpecscopeError as exc:
        assert "\n" not in str(exc)
    assert path.read_bytes() == store_bytes
