"""REQUEST_ACCEPT_OUTLIER (doctor/_rules_outlier.py) over runs written through the real Store: the
near-zero request and the repeating all-accepted request are named with an excerpt of their text; a
run whose requests merely differ is not flagged."""

from __future__ import annotations

from _acceptance_runs import Req, write_run

from specscope.doctor import diagnose, text_repeats

PROSE = ("Speculative decoding drafts several tokens cheaply and lets the target verify them in one "
         "forward pass, keeping every token the target would have chosen.")
LOOP = "I am sorry. " * 12


def _healthy(i: int) -> Req:
    return Req([(i + s) % 4 for s in range(10)], start=10.0 * i, text=f"{i}: {PROSE}")


def test_outliers_are_named_with_their_text(store):
    requests = [_healthy(i) for i in range(6)]
    requests.append(Req([0] * 12, start=100, text="garbled !!@# zxq"))  # r6: accepts nothing
    requests.append(Req([4] * 12, start=110, text=LOOP))  # r7: every draft accepted, a loop
    requests.append(Req([4] * 12, start=120, text=PROSE))  # r8: every draft accepted, ordinary text
    write_run(store, "outliers", requests)
    (finding,) = [f for f in diagnose(store, "outliers").findings if f.code == "REQUEST_ACCEPT_OUTLIER"]
    e = finding.evidence
    assert [r["request_id"] for r in e["near_zero"]] == ["r6"] and e["near_zero"][0]["text_excerpt"] == "garbled !!@# zxq"
    assert [r["request_id"] for r in e["repeating"]] == ["r7"]
    assert e["repeating"][0]["text_excerpt"].startswith("I am sorry. I am sorry.")
    assert "r6" in finding.message and "r7" in finding.message


def test_requests_that_merely_differ_are_not_outliers(store):
    requests = [_healthy(i) for i in range(6)]
    requests.append(Req([0, 1, 0, 0, 1, 0, 0, 0, 1, 0], start=100, text=PROSE))  # hard: 7.5% accepted, not near zero
    requests.append(Req([0] * 4, start=110, text="short"))  # near zero but too few steps to judge
    write_run(store, "differ", requests)
    assert "REQUEST_ACCEPT_OUTLIER" not in diagnose(store, "differ").codes()


def test_repetition_is_told_from_prose():
    assert text_repeats(LOOP) and text_repeats("ab" * 40)
    assert not text_repeats(PROSE) and not text_repeats(None) and not text_repeats("ab" * 10)


def test_the_requests_page_marks_the_outliers(monkeypatch, tmp_path):
    from test_app_pages import app, texts, visit

    from specscope.storage import open_store

    requests = [_healthy(i) for i in range(6)]
    requests.append(Req([0] * 12, start=100, text="garbled !!@# zxq"))
    requests.append(Req([4] * 12, start=110, text=LOOP))
    with open_store(str(tmp_path / "s.db")) as store:
        write_run(store, "outliers", requests)
    at = visit(app(monkeypatch, str(tmp_path / "s.db")), "requests")
    assert texts(at, "warning")[0].startswith("**REQUEST_ACCEPT_OUTLIER** — ")
    table = at.dataframe[-1].value
    marks = dict(zip(table["request"], table["doctor"]))
    assert marks.pop("r6") == "outlier: accepts next to nothing"
    assert marks.pop("r7") == "outlier: accepts all, text repeats"
    assert set(marks.values()) == {""}
