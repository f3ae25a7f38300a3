"""Shared pytest fixtures.

Storage (real databases, no mocks):

- ``store_url``: a fresh, empty store location, parametrized over ``sqlite`` (a file in ``tmp_path``)
  and ``postgresql`` (a new schema of the server named by ``SPECSCOPE_TEST_PG_URL``, selected through
  ``search_path`` and dropped afterwards, so parallel runs never collide).
- ``pg_url``: the PostgreSQL case alone.
- ``store``: an open :class:`~specscope.storage.Store` at ``store_url``, closed afterwards.

PostgreSQL tests are skipped when the server is unreachable, unless ``SPECSCOPE_REQUIRE_PG=1`` (CI),
which turns the skip into a failure. They carry the ``postgres`` marker.

Checkpoints: ``ok_eagle3``, a healthy small EAGLE-3 checkpoint built by ``tests/_tiny_eagle3.py``.

Workers: ``make test`` runs two pytest-xdist workers, each given whole test modules (so a module's
fixtures, such as the vLLM runs of tests/test_vllm.py, are built once), the modules that run real
engines first; each worker's torch runs on its share of the cores.
"""

from __future__ import annotations

import functools
import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import _tiny_eagle3
import pytest
import sqlalchemy as sa
import torch

from specscope.storage import Store, open_store

ENGINE_FIXTURES = frozenset({"target_pair", "demo_store"})


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        # The workers share the cores: torch threads split between them, here and in the processes a
        # test spawns (engine ranks, the compiled vLLM), or OpenMP threads spin against the other
        # worker's and slow both many times over.
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def _cost(item: pytest.Item) -> int:
    """0: the test runs vLLM; 1: another real engine or the target model; 2: neither."""
    if item.get_closest_marker("vllm"):
        return 0
    if ENGINE_FIXTURES.intersection(item.fixturenames) or any(map(item.get_closest_marker, ("slow", "llamacpp"))):
        return 1
    return 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # xdist (--dist loadfile --no-loadscope-reorder) hands out whole modules in this order: the
    # modules running real engines (minutes each) first, so that no long one starts last and runs
    # alone at the end while the other worker idles.
    cost: dict[Path, int] = {}
    for item in items:
        cost[item.path] = min(cost.get(item.path, 2), _cost(item))
    items.sort(key=lambda item: cost[item.path])


PG_URL = os.environ.get("SPECSCOPE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _torch_thread_state() -> tuple:
    """What a test can leave behind in torch's per-thread state: grad mode, the dispatch keys excluded
    and included, and the torch-function and dispatch mode stacks."""
    return (torch.is_grad_enabled(), repr(torch._C._dispatch_tls_local_exclude_set()),
            repr(torch._C._dispatch_tls_local_include_set()), torch._C._len_torch_function_stack(),
            torch._C._len_torch_dispatch_stack())


_CLEAN_TORCH_STATE = _torch_thread_state()


@pytest.fixture(autouse=True)
def _torch_state_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """Torch's grad mode and dispatch state belong to the thread, and a worker's main thread runs every
    test of its modules: a worker's later compile and training tests failed, far from whatever changed
    that state (docs/design.md, "The test suite"). A change is named in a warning; grad mode is turned
    back on."""
    yield
    state = _torch_thread_state()
    if state != _CLEAN_TORCH_STATE:
        torch.set_grad_enabled(True)
        warnings.warn(f"{request.node.nodeid} left torch's thread state changed: {state} "
                      f"(at the start: {_CLEAN_TORCH_STATE})", stacklevel=1)


@functools.cache
def _pg_unreachable_reason() -> str | None:
    engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:  # any failure means "no server for these tests"
        return f"PostgreSQL at {PG_URL} unreachable: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()
    return None


def _pg_schema_url() -> Iterator[str]:
    reason = _pg_unreachable_reason()
    if reason is not None:
        if os.environ.get("SPECSCOPE_REQUIRE_PG") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    schema = f"specscope_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL, pool_pre_ping=True)  # survives a server restart (pgrestart tests)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = sa.make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh PostgreSQL schema (skips or fails when the server is unreachable, see above)."""
    yield from _pg_schema_url()


@pytest.fixture
def other_pg_url() -> Iterator[str]:
    """A second fresh schema of the same server, beside :func:`pg_url`'s."""
    yield from _pg_schema_url()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A fresh store location: a SQLite path, or a PostgreSQL URL of a new, empty schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
    else:
        yield from _pg_schema_url()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A newly created, open store at ``store_url``; closed after the test."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session")
def ok_eagle3(tmp_path_factory) -> Path:
    """A healthy small EAGLE-3 checkpoint folder (tests/_tiny_eagle3.py); copy it before changing it."""
    return _tiny_eagle3.write(tmp_path_factory.mktemp("ok-eagle3"))


@pytest.fixture(scope="session")
def target_pair():
    """The real SmolLM2-135M-Instruct target and tokenizer, loaded once per session (from the
    dequantized cache after the first run)."""
    from specscope.engine import load_target

    return load_target()


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> str:
    """A SQLite store holding three real reference-engine runs, healthy, ``no-aux-capture``, then two
    ranks of which rank 1 runs ``no-aux-capture``, written by ``specscope.adapters.reference`` as ``make demo`` does
    (instrumented, provenance on), with the doctor's findings saved. Returns the store path; the run
    ids are in ``runs`` (oldest first)."""
    from specscope.adapters.reference import DemoOptions, run_demo
    from specscope.doctor import diagnose, save_findings

    path = str(tmp_path_factory.mktemp("demo") / "demo.db")
    runs = ((None, 1, None), ("no-aux-capture", 1, None), (None, 2, (1, "no-aux-capture")))
    for fault, ranks, rank_fault in runs:
        run_id = run_demo(DemoOptions(db=path, requests=4, fault=fault, max_new_tokens=32, ranks=ranks,
                                      rank_fault=rank_fault))
        with open_store(path) as store:
            save_findings(store, diagnose(store, run_id))
    return path
