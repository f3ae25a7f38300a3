"""The COPY bulk-insert strategy: the same rows as executemany, inside the write transaction."""

from __future__ import annotations

import pytest

from specscope import events as ev
from specscope.collector.loadgen import rank_events
from specscope.errors import ConfigError, StoreError
from specscope.storage import open_store

TABLES = {"verify_steps": "request_id, rank, step, proposed, accepted, accepted_mask, draft_s, "
                          "verify_s, emitted, steps",  # ts_wall: each build of the events reads the clock
          "tensor_events": "rank, hook_point, call_index, shape, width, dtype, device, expected_shape, "
                           "expected_width, absmax, mean, nonfinite, request_id, step, graph_phase",
          "requests": "request_id, rank, prompt_tokens, output_tokens, verify_steps",
          "provenance": "configured, received, matches, width",
          "load_reports": "missing, renamed, strict, loaded"}


def _extra_events(run_id: str) -> list[ev.Event]:
    """Values the decode mix lacks: NULLs, JSON text, booleans, quotes, tabs and newlines."""
    return [ev.VerifyStep(run_id=run_id, request_id="q\t'1'", rank=0, step=0, proposed=4, accepted=2,
                          emitted=("a\nb", "\\N", "c"), ts_wall=1.5),
            ev.VerifyGroup(run_id=run_id, request_id="q2", rank=0, accepted_mask="1100", steps=3, proposed=12,
                           accepted=6, ts_wall=2.0),
            ev.ProvenanceEvent(run_id=run_id, rank=0, call_index=1, configured=(2, 15, 27), received=(2, None, 27),
                               width=1728, ts_wall=3.0),
            ev.LoadReport(run_id=run_id, rank=0, module="draft", source="/m", strict=False, loaded=3,
                          missing=("a",), unexpected=(), renamed=(("x", "y"),), ts_wall=4.0)]


@pytest.mark.postgres
def test_copy_stores_exactly_what_executemany_stores(pg_url: str) -> None:
    contents = {}
    for bulk in ("executemany", "copy"):
        run_id = f"r-{bulk}"
        with open_store(pg_url, bulk=bulk) as store:
            store.write(rank_events(run_id, 0, 1, 800) + _extra_events(run_id))
            contents[bulk] = {t: store.query(f"SELECT {cols} FROM {t} WHERE run_id = '{run_id}' "
                                             f"ORDER BY {cols}")[1] for t, cols in TABLES.items()}
    assert contents["copy"] == contents["executemany"]
    assert len(contents["copy"]["verify_steps"]) > 100 and len(contents["copy"]["provenance"]) == 1


@pytest.mark.postgres
def test_a_bad_row_fails_the_whole_copy_transaction(pg_url: str) -> None:
    with open_store(pg_url, bulk="copy") as store:
        good = ev.VerifyStep(run_id="r", request_id="q", rank=0, step=0, proposed=4, accepted=1)
        too_long = ev.VerifyStep(run_id="r" * 100, request_id="q", rank=0, step=1, proposed=4, accepted=1)
        with pytest.raises(StoreError, match="writing to"):
            store.write([good, too_long])
        assert store.query("SELECT COUNT(*) FROM verify_steps")[1] == [(0,)]
        store.write([good])
        assert store.query("SELECT COUNT(*) FROM verify_steps")[1] == [(1,)]


def test_copy_needs_postgresql_and_names_are_checked(tmp_path) -> None:
    with pytest.raises(ConfigError, match="needs PostgreSQL"):
        open_store(str(tmp_path / "s.db"), bulk="copy")
    with pytest.raises(ConfigError, match="unknown bulk"):
        open_store(str(tmp_path / "s.db"), bulk="fast")
    assert not (tmp_path / "s.db").exists()
