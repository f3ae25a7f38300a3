"""Schema versions: fresh stores, upgrades, newer stores, things that are not stores, concurrent opens."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest
import sqlalchemy as sa
from _threads import at_once

from specscope.errors import SchemaVersionError, StoreError
from specscope.event_checks import RECOVERED_COLUMNS, SURPRISE_COLUMNS
from specscope.storage import SCHEMA_VERSION, migrations, open_store, schema
from specscope.storage.queries import RUNS
from specscope.storage.views import VIEWS


def _engine(url: str) -> sa.Engine:
    """A plain SQLAlchemy engine on the store, to tamper with it as another program would."""
    return sa.create_engine(url if "://" in url else f"sqlite:///{url}")


def _versions(url: str) -> list[tuple]:
    with open_store(url, read_only=True) as store:
        return store.query("SELECT version, name FROM schema_migrations ORDER BY version")[1]


def test_fresh_store_has_the_current_version_tables_views_and_positions(store_url: str) -> None:
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION
        with store.connect() as conn:
            inspector = sa.inspect(conn)
            assert set(schema.metadata.tables) <= set(inspector.get_table_names())
            assert set(VIEWS) <= set(inspector.get_view_names())
        assert store.query("SELECT MIN(pos), MAX(pos), COUNT(*) FROM positions")[1] == [
            (0, schema.MAX_POSITIONS - 1, schema.MAX_POSITIONS)]
    assert _versions(store_url) == [(m.version, m.name) for m in migrations.MIGRATIONS]
    assert migrations.MIGRATIONS[-1].version == SCHEMA_VERSION


def test_reopening_applies_nothing_twice(store_url: str) -> None:
    open_store(store_url).close()
    open_store(store_url).close()
    assert len(_versions(store_url)) == SCHEMA_VERSION


def test_newer_store_is_refused_naming_both_versions(store_url: str) -> None:
    open_store(store_url).close()
    engine = _engine(store_url)
    with engine.begin() as conn:
        conn.execute(schema.schema_migrations.insert().values(
            version=SCHEMA_VERSION + 1, name="from_the_future", applied_wall=0.0))
    engine.dispose()
    for read_only in (False, True):
        with pytest.raises(SchemaVersionError, match=rf"version {SCHEMA_VERSION + 1}.*{SCHEMA_VERSION}"):
            open_store(store_url, read_only=read_only)


def test_older_store_gets_the_pending_steps(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    open_store(store_url).close()  # a store at today's version plays the "older" one
    applied = []

    def add_notes(conn: sa.Connection) -> None:
        applied.append(True)
        conn.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")

    next_version = SCHEMA_VERSION + 1
    monkeypatch.setattr(schema, "SCHEMA_VERSION", next_version)
    monkeypatch.setattr(migrations, "MIGRATIONS",
                        (*migrations.MIGRATIONS, migrations.Migration(next_version, "add_notes", add_notes)))
    with pytest.raises(StoreError, match="open it once writable"):
        open_store(store_url, read_only=True)
    with open_store(store_url) as store:
        assert store.schema_version == next_version
        assert store.query("SELECT COUNT(*) FROM notes")[1] == [(0,)]
        assert store.fetch(RUNS) == []  # views recreated and usable
    open_store(store_url).close()
    assert applied == [True]
    assert _versions(store_url)[-1] == (next_version, "add_notes")


def test_a_missing_view_is_recreated(store_url: str) -> None:
    open_store(store_url).close()
    engine = _engine(store_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP VIEW v_run_summary")
    engine.dispose()
    with open_store(store_url) as store:
        assert store.fetch(RUNS) == []


def test_foreign_sqlite_database_is_not_a_store(tmp_path) -> None:
    """Refused before any writable connection: one used to switch the file to WAL first (its header
    changed; found by an attack trial through ``specscope replay``)."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    conn.close()
    before = path.read_bytes()
    for read_only, create in ((False, True), (False, False), (True, False)):
        with pytest.raises(StoreError, match="not a specscope store.*customers"):
            open_store(str(path), read_only=read_only, create=create)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_an_empty_file_opened_without_create_is_left_as_it_is(tmp_path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="no specscope store"):
            open_store(str(path), read_only=read_only, create=False)
    assert path.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_foreign_postgres_schema_is_not_a_store(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    engine.dispose()
    with pytest.raises(StoreError, match="not a specscope store.*customers"):
        open_store(pg_url)


def test_text_file_is_not_a_store(tmp_path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database, just some notes\n" * 20)
    for read_only in (False, True):
        with pytest.raises(StoreError, match="not a database"):
            open_store(str(path), read_only=read_only)
    assert path.read_text().startswith("this is not a database")


def test_missing_store_without_create(tmp_path) -> None:
    path = tmp_path / "absent" / "store.db"
    with pytest.raises(StoreError, match="no specscope store"):
        open_store(str(path), create=False)
    with pytest.raises(StoreError, match="no specscope store"):
        open_store(str(path), read_only=True)
    assert not path.parent.exists()


def test_empty_postgres_schema_without_create(pg_url: str) -> None:
    with pytest.raises(StoreError, match="no specscope store"):
        open_store(pg_url, create=False)


def test_create_makes_parent_directories(tmp_path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    open_store(str(path)).close()
    assert path.is_file()


def test_unwritable_location_is_a_store_error(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="a-file"):
        open_store(str(blocker / "store.db"))


def test_concurrent_first_opens_create_one_store(store_url: str, tmp_path) -> None:
    """Openers racing to create one store all succeed (SQLite: several fresh files in turn, since the
    switch to WAL could fail at once with "database is locked" while another opener created the file,
    seen only under load)."""
    urls = [store_url] if not store_url.endswith(".db") else [str(tmp_path / f"race-{i}.db") for i in range(10)]
    for url in urls:
        assert at_once(lambda url=url: open_store(url).close(), 6) == []
        assert len(_versions(url)) == SCHEMA_VERSION


def test_a_version_3_store_with_data_upgrades_keeping_every_row(store_url: str, monkeypatch) -> None:
    """A store created by the version 1-3 steps (the views of that time included) and holding a run
    opens at the current version: rows kept, the redundant tensor index gone, the views answering."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="r", engine="e", engine_version="0", target_model="t", draft_model="d",
                                 config={}, ts_wall=1.0),
                     ev.RequestStart(run_id="r", request_id="q", rank=0, prompt_tokens=3, ts_wall=1.0),
                     *[ev.VerifyStep(run_id="r", request_id="q", rank=0, step=i, proposed=4, accepted=a,
                                     ts_wall=2.0 + i) for i, a in enumerate([4, 0])]])
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables; a real version-3 store had this index
        conn.exec_driver_sql("CREATE INDEX ix_tensor_events_run_point ON tensor_events (run_id, hook_point, rank)")
    engine.dispose()
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION
        with store.connect() as conn:
            indexes = {ix["name"] for ix in sa.inspect(conn).get_indexes("tensor_events")}
        # version 5 dropped the redundant prefix index, version 8 the covering one (tensor_shapes reads)
        assert indexes == {"ix_tensor_events_run", "ix_tensor_events_nonfinite"}
        assert store.query("SELECT verify_steps, accepted FROM v_run_acceptance")[1] == [(2, 4)]  # backfilled
        assert store.query("SELECT request_id, position, accepted_steps FROM v_request_position_acceptance "
                           "WHERE run_id = 'r' ORDER BY position")[1] == [
            ("q", 0, 1), ("q", 1, 1), ("q", 2, 1), ("q", 3, 1)]


def test_a_version_5_store_with_data_upgrades_to_weighted_verify_steps(store_url: str, monkeypatch) -> None:
    """A version-5 store (verify_steps without ``steps``, the old mask index, views of that time gone
    with it) holding per-step rows opens at version 6: every old row counts as one step, aggregate rows
    written afterwards weigh as their steps, and the mask index covers ``steps``."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 5)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:5])
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="r", engine="e", engine_version="0", target_model="t", draft_model="d",
                                 config={}, ts_wall=1.0),
                     ev.RequestStart(run_id="r", request_id="q", rank=0, prompt_tokens=3, ts_wall=1.0),
                     *[ev.VerifyStep(run_id="r", request_id="q", rank=0, step=i, proposed=4, accepted=a,
                                     ts_wall=2.0 + i) for i, a in enumerate([4, 0, 1])]])
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take them back to version 5
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        conn.exec_driver_sql("DROP INDEX ix_verify_steps_masks")
        conn.exec_driver_sql("ALTER TABLE verify_steps DROP COLUMN steps")
        conn.exec_driver_sql("CREATE INDEX ix_verify_steps_masks ON verify_steps "
                             "(run_id, accepted_mask, proposed, accepted)")
    engine.dispose()
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        with store.connect() as conn:  # version 6 rebuilt the mask index with steps; version 17 dropped it
            assert "ix_verify_steps_masks" not in {ix["name"] for ix in sa.inspect(conn).get_indexes("verify_steps")}
        assert store.query("SELECT verify_steps, accepted, step_detail FROM v_request_acceptance")[1] == [(3, 5, 1)]
        store.write([ev.VerifyGroup(run_id="r", request_id="q", rank=0, accepted_mask="1000", steps=5,
                                    proposed=20, accepted=5, ts_wall=9.0)])
        assert store.query("SELECT verify_steps, proposed, accepted FROM v_run_acceptance")[1] == [(8, 32, 10)]
        assert store.query("SELECT position, accepted_steps, verify_steps FROM v_position_acceptance "
                           "ORDER BY position")[1] == [(0, 7, 8), (1, 1, 8), (2, 1, 8), (3, 1, 8)]
    assert _versions(store_url)[5:] == [(6, "weighted_verify_steps"), (7, "mixed_graph_mode_view"),
                                         (8, "summary_tables"), (9, "sampling_and_audit"), (10, "lost_runs_view"),
                                         (11, "audit_pit"), (12, "token_ids_and_replay"),
                                         (13, "wide_counters_and_unique_steps"), (14, "audit_surprise"),
                                          (15, "audit_recovered"), (16, "request_and_second_summaries"),
                                         (17, "lean_tensor_events"),
                                         (18, "orphan_runs_view")]


def test_a_version_8_store_with_data_upgrades_to_sampling_and_audit(store_url: str, monkeypatch) -> None:
    """A version-8 store (requests without sampling settings, run_ranks without error, no audit table)
    opens at version 9: old requests fall in the 'unknown' sampling group, new ones carry theirs, the
    audit table and views work, and the old rows are untouched."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 8)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:8])
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="r", engine="e", engine_version="0", target_model="t", draft_model="d",
                                 config={}, ts_wall=1.0),
                     ev.RequestStart(run_id="r", request_id="old", rank=0, prompt_tokens=3, ts_wall=1.0),
                     ev.VerifyStep(run_id="r", request_id="old", rank=0, step=0, proposed=4, accepted=2)])
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take them back to version 8
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        conn.exec_driver_sql("DROP TABLE lossless_audit")
        for column in ("sampling", "temperature", "top_p", "top_k", "prompt_key"):
            conn.exec_driver_sql(f"ALTER TABLE requests DROP COLUMN {column}")
        conn.exec_driver_sql("ALTER TABLE run_ranks DROP COLUMN error")
    engine.dispose()
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        store.write([ev.RequestStart(run_id="r", request_id="new", rank=0, prompt_tokens=3, temperature=0.0),
                     ev.VerifyStep(run_id="r", request_id="new", rank=0, step=0, proposed=4, accepted=4),
                     ev.LosslessAudit(run_id="r", rank=0, request_id="new", sampling="greedy", tokens=5)])
        assert store.query("SELECT sampling, verify_steps, accepted FROM v_sampling_acceptance "
                           "ORDER BY sampling")[1] == [("greedy", 1, 4), ("unknown", 1, 2)]
        assert store.query("SELECT tokens_audited, verdict FROM v_lossless_audit")[1] == [(5, "passed")]
    assert _versions(store_url)[8:] == [(9, "sampling_and_audit"), (10, "lost_runs_view"), (11, "audit_pit"),
                                         (12, "token_ids_and_replay"), (13, "wide_counters_and_unique_steps"),
                                         (14, "audit_surprise"), (15, "audit_recovered"), (16, "request_and_second_summaries"),
                                         (17, "lean_tensor_events"),
                                         (18, "orphan_runs_view")]


def test_a_version_10_store_with_audits_upgrades_to_the_distribution_tests(store_url: str, monkeypatch) -> None:
    """A version-10 store's audit rows (no variance, no PIT histogram) keep their figures at version
    11; the distribution tests skip them, so a sampled group audited only before reads 'too few
    tokens', and rows audited since are judged."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 10)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:10])
    with open_store(store_url):
        pass
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take lossless_audit back to version 10
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        for column in ("p_var_sum", *(f"pit_{b}" for b in range(ev.PIT_BINS))):
            conn.exec_driver_sql(f"ALTER TABLE lossless_audit DROP COLUMN {column}")
        conn.exec_driver_sql("INSERT INTO lossless_audit (run_id, rank, request_id, sampling, tokens, mismatches, "
                             "rare, rare_expected, p_sum, p2_sum, epsilon, example, ts_wall) VALUES "
                             "('r', 0, 'old', 'T=0.8', 500, 0, 1, 0.5, 250.0, 200.0, 0.0001, NULL, 1.0)")
    engine.dispose()
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        assert store.query("SELECT tokens_audited, rare_observed, scored_tokens, verdict FROM v_lossless_audit"
                           )[1] == [(500, 1, 0, "too few tokens")]
        store.write([ev.LosslessAudit("r", 0, "new", "T=0.8", tokens=1000, p_sum=300.0, p2_sum=300.0,
                                      p_var_sum=50.0, epsilon=1e-4, pit=(100,) * ev.PIT_BINS)])
        assert store.query("SELECT tokens_audited, scored_tokens, p_excess, verdict FROM v_lossless_audit"
                           )[1] == [(1500, 1000, 0.0, "passed")]
    assert _versions(store_url)[10:13] == [(11, "audit_pit"), (12, "token_ids_and_replay"),
                                           (13, "wide_counters_and_unique_steps")]


def test_a_version_11_store_with_runs_upgrades_to_token_ids_and_replay(store_url: str, monkeypatch) -> None:
    """A version-11 store (no token ids, no replay) opens at version 12 with its rows untouched: its
    old requests have no ids to replay, new ones keep theirs, and replayed results reach the view."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 11)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:11])
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="r", engine="e", engine_version="0", target_model="t", draft_model="d",
                                 config={}, ts_wall=1.0),
                     ev.RequestStart(run_id="r", request_id="old", rank=0, prompt_tokens=3, temperature=0.0)])
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take them back to version 11
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        conn.exec_driver_sql("DROP TABLE request_tokens")
        conn.exec_driver_sql("DROP TABLE replay_requests")
    engine.dispose()
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        assert store.query("SELECT COUNT(*) FROM request_tokens")[1] == [(0,)]
        store.write([ev.RequestStart(run_id="r", request_id="new", rank=0, prompt_tokens=2, temperature=0.0),
                     ev.RequestTokens("r", 0, "new", (1, 2), (3,)),
                     ev.ReplayResult("r", "new", "folder", 0.25, ev.LosslessAudit("r", 0, "new", "greedy", 1))])
        assert store.query("SELECT request_id, prompt_ids, output_ids FROM request_tokens")[1] == [
            ("new", "[1,2]", "[3]")]
        assert store.query("SELECT requests, tokens_audited, departures, verdict FROM v_replay_audit")[1] == [
            (1, 1, 0, "passed")]
        assert store.query("SELECT request_id FROM requests ORDER BY request_id")[1] == [("new",), ("old",)]
    assert _versions(store_url)[11] == (12, "token_ids_and_replay")


def test_a_version_12_store_with_counters_upgrades_to_wide_counters(store_url: str, monkeypatch) -> None:
    """A version-12 store (INTEGER counters on PostgreSQL) holding a run opens at version 13 with its
    rows kept, and its summary then takes a (rank, mask) past 2**31 - 1 proposed tokens."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 12)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:12])
    window = 1_500_000_000
    group = ev.VerifyGroup(run_id="r", request_id="w", rank=0, accepted_mask="1000", steps=window,
                           proposed=window, accepted=window, ts_wall=2.0)
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="r", engine="e", engine_version="0", target_model="t", draft_model="d",
                                 config={}, ts_wall=1.0), group], counters={("r", 0): (window, 0)})
    engine = _engine(store_url)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:  # step 1 builds today's tables: take the counters back to INTEGER
            for name in reversed(VIEWS):
                conn.exec_driver_sql(f"DROP VIEW {name}")
            for table, columns in migrations.WIDE_COUNTERS.items():
                conn.exec_driver_sql(f"ALTER TABLE {table} "
                                     + ", ".join(f"ALTER COLUMN {c} TYPE INTEGER" for c in columns))
    engine.dispose()
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        store.write([group], counters={("r", 0): (window, 0)})
        assert store.query("SELECT verify_steps, proposed, events_written FROM v_run_summary")[1] == [
            (2 * window, 2 * window, 2 * window)]
    assert _versions(store_url)[12] == (13, "wide_counters_and_unique_steps")


def test_a_version_12_store_with_duplicate_verify_steps_keeps_each_once(store_url: str, monkeypatch) -> None:
    """A version-12 store that stored a numbered verify step three times (and aggregate rows twice) opens
    at version 13 with that step once, the aggregates kept, and the summary rebuilt to match."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 12)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:12])
    step = ev.VerifyStep(run_id="r", request_id="q", rank=0, step=0, proposed=4, accepted=4, ts_wall=2.0)
    window = ev.VerifyGroup(run_id="r", request_id="w", rank=0, accepted_mask="1000", steps=2, proposed=8,
                            accepted=2, ts_wall=3.0)
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="r", engine="e", engine_version="0", target_model="t", draft_model="d",
                                 config={}, ts_wall=1.0), ev.RequestStart("r", "q", 0, prompt_tokens=3),
                     step, window, window, dataclasses.replace(step, step=1, accepted=0)])
        engine = _engine(store_url)
        with engine.begin() as conn:  # what a version-12 write path stored: step 0 twice more
            for _ in range(2):
                conn.exec_driver_sql("INSERT INTO verify_steps (run_id, request_id, rank, step, proposed, accepted, "
                                     "accepted_mask, ts_wall, steps) VALUES ('r', 'q', 0, 0, 4, 4, '1111', 2.0, 1)")
        engine.dispose()
        store.rebuild_summaries()
        assert store.query("SELECT verify_steps, accepted FROM v_run_acceptance")[1] == [(8, 16)]
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        assert store.query("SELECT step, accepted FROM verify_steps WHERE step >= 0 ORDER BY step")[1] == [
            (0, 4), (1, 0)]
        assert store.query("SELECT verify_steps, accepted FROM v_run_acceptance")[1] == [(2 + 4, 4 + 4)]
        assert store.query("SELECT verify_steps, accepted FROM v_request_acceptance WHERE request_id = 'q'"
                           )[1] == [(2, 4)]
    assert _versions(store_url)[12] == (13, "wide_counters_and_unique_steps")


def test_a_version_13_store_with_audits_upgrades_to_the_surprise_test(store_url: str, monkeypatch) -> None:
    """A version-13 store's audit and replay rows (no surprise figures) keep theirs at version 14 and
    add nothing to the surprise test; rows audited since are judged by it."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 13)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:13])
    with open_store(store_url):
        pass
    old = ev.LosslessAudit("r", 0, "old", "T=0.8", tokens=1000, p_sum=300.0, p2_sum=300.0, p_var_sum=50.0,
                           epsilon=1e-4, pit=(100,) * ev.PIT_BINS)
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take both back to version 13
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        for table in ("lossless_audit", "replay_requests"):
            for column in SURPRISE_COLUMNS:
                conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.exec_driver_sql("INSERT INTO lossless_audit (run_id, rank, request_id, sampling, tokens, mismatches, "
                             "rare, rare_expected, p_sum, p2_sum, epsilon, example, ts_wall, p_var_sum, "
                             + ", ".join(f"pit_{b}" for b in range(ev.PIT_BINS)) + ") VALUES "
                             "('r', 0, 'old', 'T=0.8', 1000, 0, 0, 0.0, 300.0, 300.0, 0.0001, NULL, 1.0, 50.0, "
                             + ", ".join("100" for _ in range(ev.PIT_BINS)) + ")")
    engine.dispose()
    monkeypatch.undo()
    query = "SELECT tokens_audited, surprise_excess, surprise_failed, verdict FROM v_lossless_audit"
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        assert store.query(query)[1] == [(1000, 0.0, 0, "passed")]
        # 1000 tokens of a sharpened verifier: surprise 0.5 per token below an entropy of 1.0 (variance 0.5)
        sharpened = dataclasses.replace(old, request_id="new", surprise_sum=500.0, entropy_sum=1000.0,
                                        surprise_var_sum=500.0, entropy_max=2.0)
        store.write([sharpened, ev.ReplayResult("r", "new", "folder", 0.25, sharpened)])
        assert store.query(query)[1] == [(2000, -500.0, 1, "violation")]
        assert store.query("SELECT surprise_excess, surprise_failed FROM v_replay_audit")[1] == [(-500.0, 1)]
    assert _versions(store_url)[13:] == [(14, "audit_surprise"), (15, "audit_recovered"), (16, "request_and_second_summaries"),
                                         (17, "lean_tensor_events"),
                                         (18, "orphan_runs_view")]


def test_a_version_14_store_with_audits_upgrades_to_the_recovered_token_check(store_url: str, monkeypatch) -> None:
    """A version-14 store's audit rows (no recovered-token figures) read 0 recovered tokens checked at
    version 15, so they pass it; a row audited since with a recovered token equal to its draft fails it."""
    from specscope import events as ev

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 14)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:14])
    with open_store(store_url):
        pass
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take the audit's back to version 14
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        for column in RECOVERED_COLUMNS:
            conn.exec_driver_sql(f"ALTER TABLE lossless_audit DROP COLUMN {column}")
        conn.exec_driver_sql("INSERT INTO lossless_audit (run_id, rank, request_id, sampling, tokens, mismatches, "
                             "rare, rare_expected, p_sum, p2_sum, epsilon, example, ts_wall) VALUES "
                             "('r', 0, 'old', 'T=0.8', 10, 0, 0, 0.0, 3.0, 3.0, 0.0001, NULL, 1.0)")
    engine.dispose()
    monkeypatch.undo()
    query = ("SELECT tokens_audited, recovered_audited, recovered_as_draft, recovered_failed, verdict "
             "FROM v_lossless_audit")
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        assert store.query(query)[1] == [(10, 0, 0, 0, "too few tokens")]
        store.write([ev.LosslessAudit("r", 0, "new", "T=0.8", tokens=4, epsilon=1e-4, recovered=1,
                                      recovered_as_draft=1, recovered_p_sum=0.3)])
        assert store.query(query)[1] == [(14, 1, 1, 1, "violation")]
    assert _versions(store_url)[14:] == [(15, "audit_recovered"), (16, "request_and_second_summaries"),
                                         (17, "lean_tensor_events"),
                                         (18, "orphan_runs_view")]


def test_a_version_15_store_with_verify_steps_upgrades_to_the_request_summary(store_url: str, monkeypatch) -> None:
    """A version-15 store's verify steps (no per-request or per-second summary) are summed into
    ``request_accepts`` and ``step_seconds`` by the upgrade to version 16, and its indexes take
    ``ts_wall``: the per-request views and acceptance over time read them as before, and steps written
    since add to them."""
    from specscope import events as ev
    from specscope.storage import queries

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 15)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:15])
    with open_store(store_url) as store:
        store.write([ev.RunStart("r", "e", "0", "t", "d", {}, ts_wall=1.0),
                     ev.RequestStart("r", "q", 0, prompt_tokens=3, temperature=0.0, ts_wall=1.0)])
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take the store back to version 15
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        for table in ("request_accepts", "step_seconds", "draft_input_seconds"):
            conn.exec_driver_sql(f"DROP TABLE {table}")
        for index, columns in (("ix_verify_steps_run_rank", "verify_steps (run_id, rank)"),
                               ("ix_tensor_events_run", "tensor_events (run_id, hook_point, rank)")):
            conn.exec_driver_sql(f"DROP INDEX {index}")
            conn.exec_driver_sql(f"CREATE INDEX {index} ON {columns}")
        conn.exec_driver_sql("INSERT INTO verify_steps (run_id, request_id, rank, step, proposed, accepted, "
                             "accepted_mask, ts_wall, steps) VALUES ('r', 'q', 0, 0, 4, 2, '1100', 2.0, 1), "
                             "('r', 'q', 0, 1, 4, 0, '0000', 3.0, 1), ('r', 'q', 0, -1, 8, 2, '', 4.0, 2)")
    engine.dispose()
    monkeypatch.undo()
    query = "SELECT verify_steps, proposed, accepted, first_wall, last_wall, step_detail FROM v_request_acceptance"
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        assert store.query(query)[1] == [(4, 16, 4, 2.0, 4.0, 1)]
        assert [(h["accepted_drafts"], h["verify_steps"]) for h in store.fetch(queries.ACCEPTANCE_HISTOGRAM,
                                                                               run_id="r")] == [(0, 1), (1, 0), (2, 1), (3, 0), (4, 0)]
        assert store.fetch(queries.SAMPLING_ACCEPTANCE, run_id="r")[0]["position0_acceptance"] == 0.25
        store.write([ev.VerifyStep("r", "q", 0, step=2, proposed=4, accepted=4, ts_wall=5.0)])
        assert store.query(query)[1] == [(5, 20, 8, 2.0, 5.0, 1)]
        assert [(r["verify_steps"], r["accepted"]) for r in store.fetch(queries.ACCEPTANCE_OVER_TIME, run_id="r",
                                                                        buckets=1)] == [(5, 8)]
        with store.connect() as conn:
            indexes = {ix["name"]: ix["column_names"] for table in ("verify_steps", "tensor_events")
                       for ix in sa.inspect(conn).get_indexes(table)}
        assert indexes["ix_verify_steps_run_rank"][-1] == indexes["ix_tensor_events_run"][-1] == "ts_wall"
    assert _versions(store_url)[15:] == [(16, "request_and_second_summaries"),
                                         (17, "lean_tensor_events"),
                                         (18, "orphan_runs_view")]


def test_a_version_16_store_with_tensor_events_upgrades_to_lean_rows(store_url: str, monkeypatch) -> None:
    """A version-16 store's tensor events (a serial ``id``, ``ix_tensor_events_run`` with the hook point)
    are kept by the upgrade to version 17, values and stored order: the ``id`` and the mask index go,
    the run index is (run, rank, time); the tensor queries read them, and events written since go in
    by the store's bulk insert (COPY on PostgreSQL) and add to the summaries."""
    from specscope import events as ev
    from specscope.storage import queries

    def tensor(call: int, nonfinite: int | None = None, rank: int = 0) -> ev.TensorEvent:
        return ev.TensorEvent("r", rank, "draft.fc:input", call, (1, 4, 12), "float16", "cpu", expected_shape=(-1, -1, 12),
                              nonfinite=nonfinite, request_id="q", step=call, ts_wall=10.0 + call / 4)

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 16)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:16])
    open_store(store_url).close()
    engine = _engine(store_url)
    with engine.begin() as conn:  # step 1 builds today's tables: take tensor_events back to version 16
        for name in reversed(VIEWS):
            conn.exec_driver_sql(f"DROP VIEW {name}")
        conn.exec_driver_sql("DROP TABLE tensor_events")
        sa.Table("tensor_events", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                 *(sa.Column(c.name, c.type, nullable=c.nullable) for c in schema.tensor_events.columns)).create(conn)
        conn.exec_driver_sql("CREATE INDEX ix_tensor_events_run ON tensor_events (run_id, hook_point, rank, ts_wall)")
        conn.exec_driver_sql("CREATE INDEX ix_tensor_events_nonfinite ON tensor_events (run_id, hook_point) "
                             "WHERE nonfinite > 0")
        conn.exec_driver_sql(migrations.MASKS_INDEX.format(", steps"))
    engine.dispose()
    with open_store(store_url) as store:
        store.write([ev.RunStart("r", "e", "0", "t", "d", {}, ts_wall=1.0),
                     ev.RankStart("r", 0, world_size=1, host="h", pid=1, device="cpu", ts_wall=1.0),
                     tensor(2), tensor(0, nonfinite=3), tensor(1)])
        before = store.query("SELECT * FROM tensor_events ORDER BY id")[1]
    monkeypatch.undo()
    with open_store(store_url) as store:
        assert store.schema_version == SCHEMA_VERSION == 18
        with store.connect() as conn:
            inspector = sa.inspect(conn)
            assert [c["name"] for c in inspector.get_columns("tensor_events")] == [c.name for c in schema.tensor_events.columns]
            assert {ix["name"]: ix["column_names"] for ix in inspector.get_indexes("tensor_events")} == {
                "ix_tensor_events_run": ["run_id", "rank", "ts_wall"], "ix_tensor_events_nonfinite": ["run_id", "hook_point"]}
            assert "ix_verify_steps_masks" not in {ix["name"] for ix in inspector.get_indexes("verify_steps")}
        order = "rowid" if store.dialect == "sqlite" else "ctid"  # the order the rows were stored in
        assert store.query(f"SELECT * FROM tensor_events ORDER BY {order}")[1] == [row[1:] for row in before]
        assert [(n["elements"], n["events"]) for n in store.fetch(queries.NONFINITE, run_id="r")] == [(3, 1)]
        store.write([tensor(3), tensor(4, nonfinite=1), tensor(0, rank=1)])
        assert store.query("SELECT COUNT(*), SUM(nonfinite) FROM tensor_events")[1] == [(6, 4)]
        assert [(c["rank"], c["events"]) for c in store.fetch(queries.TENSOR_CONTRACT, run_id="r")] == [(0, 5), (1, 1)]
        assert sum(d["events"] for d in store.fetch(queries.DRAFT_INPUTS_OVER_TIME, run_id="r", buckets=3)) == 6
    assert _versions(store_url)[16:] == [(17, "lean_tensor_events"),
                                         (18, "orphan_runs_view")]
