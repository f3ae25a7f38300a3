"""The named queries of ``storage/queries.py``: each one runs on SQLite and PostgreSQL over a store with
a run in it, and a call with the wrong parameters is refused before the database sees it."""

from __future__ import annotations

import pytest

from specscope import events as ev
from specscope.errors import StoreError
from specscope.storage import queries as q

RUN = "r"
PARAMS = {"run_id": RUN, "request_id": "q", "limit": 10, "buckets": 4, "order": "duration", "source": "doctor",
          "prefix": "r", "runs": [RUN, "other"], "request_ids": ["q", "other"]}


def test_the_registry_holds_every_named_query():
    assert {query.name for query in q.QUERIES} >= {"runs", "run", "tensor_contract", "runs_draft_contract"}
    assert len({query.name for query in q.QUERIES}) == len(q.QUERIES)


@pytest.mark.parametrize("query", q.QUERIES, ids=lambda query: query.name)
def test_every_named_query_runs(store, query):
    store.write([ev.RunStart(run_id=RUN, engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={"k": 4}, ts_wall=1.0),
                 ev.RankStart(run_id=RUN, rank=0, world_size=1, host="h", pid=1, device="cpu", ts_wall=1.0),
                 ev.RequestStart(run_id=RUN, request_id="q", rank=0, prompt_tokens=3, ts_wall=1.0),
                 *[ev.VerifyStep(run_id=RUN, request_id="q", rank=0, step=i, proposed=4, accepted=a,
                                 ts_wall=2.0 + i) for i, a in enumerate([4, 0, 2])],
                 ev.TensorEvent(run_id=RUN, rank=0, hook_point="draft.forward:hidden_states", call_index=0,
                                shape=(1, 3, 1728), dtype="bfloat16", device="cpu", expected_shape=(-1, -1, 1728),
                                nonfinite=2, ts_wall=2.0)])
    rows = store.fetch(query, **{name: PARAMS[name] for name in query.params})
    assert isinstance(rows, list) and all(isinstance(row, dict) for row in rows)
    if query in (q.RUNS, q.RUN, q.RUN_META, q.POSITION_ACCEPTANCE, q.REQUESTS, q.REQUEST_STEPS,
                 q.TENSOR_CONTRACT, q.NONFINITE, q.RUNS_ACCEPTANCE, q.RUNS_DRAFT_CONTRACT, q.REQUEST_SERIES,
                 q.REQUEST_TEXTS, q.ACCEPTANCE_HISTOGRAM, q.REQUEST_DISTRIBUTION, q.ACCEPTANCE_WINDOWS,
                 q.OUTPUT_POSITION_ACCEPTANCE, q.RUNS_REQUEST_AL):
        assert rows, f"{query.name} found nothing in a store holding run {RUN}"


def test_wrong_parameters_are_refused(store):
    with pytest.raises(ValueError, match=r"run: missing parameters \['run_id'\]"):
        store.fetch(q.RUN)
    with pytest.raises(ValueError, match=r"unknown parameters \['rank'\]"):
        store.fetch(q.RUN, run_id=RUN, rank=0)


def test_fetch_takes_named_queries_and_query_takes_sql(store):
    with pytest.raises(TypeError, match="for SQL of your own use Store.query"):
        store.fetch("SELECT 1")
    with pytest.raises(StoreError, match="the query is empty"):
        store.query("  \n ")
