"""Token ids decoded to text by the collector's writer thread (``Collector(tokenizer=)``), with the
target's real tokenizer: what an engine that hands token ids (the vLLM plugin) gets stored."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from specscope import events as ev
from specscope.collector import Collector
from specscope.errors import InvalidEvent
from specscope.storage import open_store

RUN = "run-d"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from specscope.engine import target_folder

    return AutoTokenizer.from_pretrained(target_folder())


def _events(ids: list[int], step_ids: tuple[int, ...]) -> list:
    return [ev.RunStart(RUN, "vllm", "0.32", "t", "d", config={}),
            ev.RequestStart(RUN, "req", 0, prompt_tokens=3),
            ev.VerifyStep(RUN, "req", 0, 0, 4, 2, emitted_ids=step_ids),
            ev.RequestEnd(RUN, "req", 0, output_tokens=len(ids), verify_steps=1, output_ids=tuple(ids))]


def _stored(db: str) -> tuple[list, str | None]:
    with open_store(db, read_only=True) as store:
        (emitted,) = store.query("SELECT emitted FROM verify_steps WHERE run_id = :r", {"r": RUN})[1][0]
        (text,) = store.query("SELECT text FROM requests WHERE run_id = :r", {"r": RUN})[1][0]
    return (None if emitted is None else json.loads(emitted)), text


def test_ids_are_decoded_in_the_writer_thread(tmp_path, tokenizer):
    ids = tokenizer.encode(" The octopus has three hearts.")
    threads = set()

    class Watched:
        def decode(self, *args, **kwargs):
            threads.add(threading.current_thread().name)
            return tokenizer.decode(*args, **kwargs)

    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=Watched())
    for event in _events(ids + [tokenizer.eos_token_id], tuple(ids[1:4])):
        collector.emit(event)
    collector.close()
    emitted, text = _stored(db)
    assert emitted == [tokenizer.decode([i]) for i in ids[1:4]]
    assert text == " The octopus has three hearts."  # the EOS token skipped, as engines return text
    assert threads and threading.main_thread().name not in threads


def _streamed(tokenizer, prompt: list[int], ids: list[int]) -> str:
    """The text vLLM returns for ``ids``: its fast detokenizer's (``FastIncrementalDetokenizer``)
    ``DecodeStream``, primed with the prompt, one step per token, a withheld step adding nothing."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=prompt, skip_special_tokens=True)
    return "".join(stream.step(tokenizer.backend_tokenizer, i) or "" for i in ids)


def test_a_requests_text_ends_where_a_streaming_detokenizer_ends(tmp_path, tokenizer):
    """Every cut of output whose characters span several tokens (one 4-byte emoji is four byte
    tokens), and each cut followed by a lone byte of another character (junk a lossy verifier emits): the
    stored text is the text vLLM streamed, never with a trailing incomplete character."""
    prompt = tokenizer.encode("Say it:")
    ids = tokenizer.encode(" Zürich → 東京 🐙 naïve Ωμέγα ok")
    junk = ids[5:6]  # a token of one byte of 東
    assert tokenizer.decode(junk) == "\ufffd"
    outputs = [ids[:k] + tail for k in range(len(ids) + 1) for tail in ([], junk)]
    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=tokenizer)
    collector.emit(ev.RunStart(RUN, "vllm", "0.32", "t", "d", config={}))
    for n, output in enumerate(outputs):
        collector.emit(ev.RequestStart(RUN, f"r{n}", 0, prompt_tokens=len(prompt)))
        collector.emit(ev.RequestEnd(RUN, f"r{n}", 0, output_tokens=len(output), verify_steps=0,
                                     output_ids=tuple(output)))
    collector.close()
    with open_store(db, read_only=True) as store:
        stored = dict(store.query("SELECT request_id, text FROM requests WHERE run_id = :r", {"r": RUN})[1])
    expected = {f"r{n}": _streamed(tokenizer, prompt, output) for n, output in enumerate(outputs)}
    assert stored == expected
    # the cuts did fall mid-character: a one-call decode of them ends in U+FFFD, which vLLM withholds
    assert sum(tokenizer.decode(output).endswith("\ufffd") for output in outputs) >= 10


def test_output_ending_in_a_long_run_of_stray_bytes_is_walked_back_in_short_decodes(tmp_path, tokenizer):
    stray = tokenizer.encode(" 東")[1:2]  # one byte of 東, alone U+FFFD
    head = tokenizer.encode(" The octopus")
    decoded = []

    class Counted:
        def decode(self, ids, **kwargs):
            decoded.append(len(ids))
            return tokenizer.decode(ids, **kwargs)

    ends = [tokenizer.eos_token_id] * 12  # special: no text of their own, skipped
    outputs = {"short": head + stray * 50, "long": head + stray * 20_000, "specials": head + stray + ends}
    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=Counted())
    collector.emit(ev.RunStart(RUN, "vllm", "0.32", "t", "d", config={}))
    for rid, output in outputs.items():
        collector.emit(ev.RequestStart(RUN, rid, 0, prompt_tokens=1))
        collector.emit(ev.RequestEnd(RUN, rid, 0, output_tokens=len(output), verify_steps=0, output_ids=tuple(output)))
    collector.close()
    with open_store(db, read_only=True) as store:
        stored = dict(store.query("SELECT request_id, text FROM requests WHERE run_id = :r", {"r": RUN})[1])
    assert stored == {"short": " The octopus", "long": " The octopus", "specials": " The octopus"}
    for rid in ("short", "specials"):
        assert stored[rid] == _streamed(tokenizer, [], outputs[rid])  # what vLLM streams
    # one decode of a few tokens per stray byte, and one of the text: linear in the output, not quadratic
    assert len(decoded) <= 20_050 + 20 * len(outputs) and max(decoded) <= 8


def test_a_failing_tokenizer_stores_the_events_without_text(tmp_path, caplog):
    class Broken:
        def decode(self, *args, **kwargs):
            raise OSError("tokenizer.json not found")

    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=Broken())
    with caplog.at_level(logging.WARNING, logger="specscope.collector"):
        for event in _events([5, 6, 7], (5, 6)):
            collector.emit(event)
        collector.close()
    assert _stored(db) == (None, None)
    assert collector.dropped == 0
    assert sum("decoding token ids failed" in r.getMessage() for r in caplog.records) == 1


def test_a_tokenizer_raising_system_exit_keeps_the_writer_and_every_event(tmp_path):
    class Exiting:
        def decode(self, ids, **kwargs):
            if len(ids) == 3:
                raise SystemExit(3)
            return "ok"

    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=Exiting())
    for event in _events([5, 6, 7], (5,)):
        collector.emit(event)
    assert collector.flush(10)
    collector.emit(ev.RequestStart(RUN, "after", 0, prompt_tokens=1))
    collector.emit(ev.RequestEnd(RUN, "after", 0, output_tokens=2, verify_steps=0, output_ids=(1, 2)))
    collector.close()
    with open_store(db, read_only=True) as store:
        assert store.query("SELECT request_id, text FROM requests ORDER BY request_id")[1] == [("after", "ok"),
                                                                                             ("req", None)]
    assert collector.dropped == 0


@pytest.mark.parametrize("returned", [b"bytes", None, 7], ids=["bytes", "none", "int"])
def test_a_tokenizer_returning_no_text_keeps_every_event(tmp_path, returned):
    class Odd:
        def decode(self, *args, **kwargs):
            return returned

    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=Odd())
    for event in _events([5, 6, 7], (5, 6)):
        collector.emit(event)
    assert collector.flush(10)
    collector.close()
    assert _stored(db) == (None, None) and collector.dropped == 0
    with open_store(db, read_only=True) as store:  # the request's figures are all there
        assert store.query("SELECT output_tokens, verify_steps FROM requests")[1] == [(3, 1)]


def test_decoded_text_is_made_storable(tmp_path):
    class Hostile:
        def decode(self, ids, skip_special_tokens=False):
            return "a\x00b\ud800c"

    db = str(tmp_path / "d.db")
    collector = Collector(db, tokenizer=Hostile())
    for event in _events([5, 6, 7], (5,)):
        collector.emit(event)
    collector.close()
    assert _stored(db) == (["ab\ufffdc"], "ab\ufffdc")


def test_without_a_tokenizer_ids_are_not_stored_as_text(tmp_path):
    db = str(tmp_path / "d.db")
    collector = Collector(db)
    for event in _events([5, 6, 7], (5, 6)):
        collector.emit(event)
    collector.close()
    assert _stored(db) == (None, None)


@pytest.mark.parametrize("bad", [(1.5,), [1, 2], (-1,), ("a",)])
def test_emitted_ids_are_validated_at_the_boundary(bad):
    with pytest.raises(InvalidEvent, match="emitted_ids"):
        ev.VerifyStep(RUN, "req", 0, 0, 4, 2, emitted_ids=bad)
    with pytest.raises(InvalidEvent, match="output_ids"):
        ev.RequestEnd(RUN, "req", 0, output_tokens=1, verify_steps=0, output_ids=bad)


def test_more_emitted_ids_than_a_step_can_emit_are_refused():
    with pytest.raises(InvalidEvent, match="at most accepted \\+ 1 = 3"):
        ev.VerifyStep(RUN, "req", 0, 0, 4, 2, emitted_ids=(1, 2, 3, 4))


def test_a_close_that_times_out_behind_a_slow_tokenizer_says_what_may_be_lost(tmp_path, caplog):
    release = threading.Event()

    class Stuck:
        def decode(self, ids, **kwargs):
            release.wait(30)
            return "x"

    collector = Collector(str(tmp_path / "s.db"), tokenizer=Stuck())
    for event in _events([1, 2], (1,)):
        collector.emit(event)
    with caplog.at_level(logging.WARNING, logger="specscope"):
        collector.close(timeout_s=0.5)
    assert not collector.flush(1)  # the caller is told the close was lossy
    (record,) = [r for r in caplog.records if "not yet written may be lost" in r.getMessage()]
    assert "4 event(s)" in record.getMessage()
    release.set()
    collector.close(timeout_s=30)
    assert _stored(str(tmp_path / "s.db"))[1] == "x"  # written after all once the tokenizer returned
