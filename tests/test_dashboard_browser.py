"""End to end: `specscope dashboard` served to a real headless Chromium (Debian's, driven by
Playwright); every page visited, its key text asserted, nothing cut off at laptop width (no table
whose columns overflow it, no truncated run-picker label or badge, no sideways scrolling of the
page), and a 1400x900 screenshot saved (into ``$SPECSCOPE_SCREENSHOTS`` when set, e.g. docs/, else
the test's tmp dir).

The store is the lead's ``demo_store`` fixture when it exists (healthy, no-aux-capture and a two-rank
run whose rank 1 has no aux capture, of the reference engine), else ``dashboard_store``: the synthetic
healthy + faulty traces.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _dashboard_traces import trace, write_store

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# url path -> text that must be visible on the faulty (latest) run
PAGES = {"": "AUX_NOT_FUSED", "requests": "Generated text", "gpus": "Shapes seen at each hook point",
         "tensors": "Draft input width vs expected fused width", "findings": "AUX_NOT_FUSED",
         "sql": "Download CSV"}
NAMES = {"": "overview"}
# The script run is over: no skeleton placeholder left and every plotly chart drawn.
SETTLED = """() => !document.querySelector('[data-testid="stSkeleton"]')
  && [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => c.querySelector('.main-svg'))"""

# What does not fit at the window's width: a table whose columns are wider than the table (the glide
# grid's scroller scrolls sideways), a select box whose label is longer than the box, any other text
# cut with an ellipsis, and a page wider than the window.
CUT_OFF = """() => {
  const cut = [];
  document.querySelectorAll('[data-testid="stDataFrame"]').forEach((frame, i) => {
    const s = frame.querySelector('.dvn-scroller');
    if (s && s.scrollWidth > s.clientWidth + 1)
      cut.push(`table ${i}: columns ${s.scrollWidth} px wide in ${s.clientWidth} px`);
  });
  document.querySelectorAll('[data-testid="stSelectbox"] input').forEach(box => {
    if (box.scrollWidth > box.clientWidth + 1) cut.push(`select box cut: ${box.value}`);
  });
  for (const el of document.querySelectorAll('[data-testid="stMain"] *')) {
    if (getComputedStyle(el).textOverflow === 'ellipsis' && el.offsetParent
        && el.scrollWidth > el.clientWidth + 1 && !el.closest('[data-testid="stDataFrame"]'))
      cut.push(`text cut: ${el.textContent.slice(0, 60)}`);
  }
  if (document.documentElement.scrollWidth > window.innerWidth) cut.push('page wider than the window');
  return cut; }"""

CODE_COLOURS = """() => [...document.querySelectorAll('[data-testid="stMain"] code')]
  .map(el => getComputedStyle(el).color.match(/\\d+/g).slice(0, 3).map(Number))"""

NARROW = 1280  # the narrowest laptop window the pages are laid out for


def _fits(page, name: str) -> None:
    """Nothing cut off (:data:`CUT_OFF`) once the grids have laid out for the window's width."""
    try:
        page.wait_for_function(f"() => ({CUT_OFF})().length === 0", timeout=10_000)
    except Exception:  # noqa: BLE001 - Playwright's timeout: say what is cut, not that it timed out
        pass
    assert page.evaluate(CUT_OFF) == [], name


pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (make browser)")]


@pytest.fixture(scope="session")
def dashboard_store(tmp_path_factory) -> str:
    """A SQLite store with a healthy 2-rank run and a later no-aux-capture run (synthetic traces)."""
    return write_store(tmp_path_factory.mktemp("browser") / "store.db",
                       [trace("healthy-run", world_size=2, requests=8, steps=24),
                        trace("faulty-run", fault="no-aux-capture", requests=8, steps=24, t0=1_750_000_100.0)])


@pytest.fixture
def served_store(request) -> str:
    try:
        return request.getfixturevalue("demo_store")
    except pytest.FixtureLookupError:
        return request.getfixturevalue("dashboard_store")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(store: Path) -> tuple[subprocess.Popen, str]:
    """``specscope dashboard`` on a free port, once its health endpoint answers: (process, url)."""
    port = _free_port()
    # the server's output goes to a file, never a pipe nobody reads (a full pipe would stall the
    # server); _stop prints it, so a failed test's report shows it
    log = tempfile.TemporaryFile("w+", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "specscope", "dashboard", "--db", str(store),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not _healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"dashboard did not come up: {_output(proc)}")
        time.sleep(0.2)  # polling the server's health endpoint, not synchronising the test
    return proc, url


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _output(proc: subprocess.Popen) -> str:
    proc.log.seek(0)
    return proc.log.read()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    print(f"dashboard output:\n{_output(proc)[-4000:]}")
    proc.log.close()


@pytest.fixture
def server(served_store):
    proc, url = _start(served_store)
    try:
        yield url
    finally:
        _stop(proc)


def test_terminating_the_dashboard_process_stops_the_server(dashboard_store):
    """The process ``specscope dashboard`` started is the server: SIGTERM to its pid frees the port
    (no orphaned Streamlit child left serving)."""
    proc, url = _start(dashboard_store)
    _stop(proc)
    assert proc.returncode is not None and not _healthy(url)


@contextlib.contextmanager
def _chromium_page(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """A 1400x900 page of headless Chromium and the folder screenshots go to."""
    sync_api = pytest.importorskip("playwright.sync_api")
    shots = Path(os.environ.get("SPECSCOPE_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            yield page, shots
        except sync_api.Error as exc:  # a wait that timed out: what the page showed instead
            try:
                shown = page.inner_text("body", timeout=5_000)[:4000]
            except sync_api.Error as again:
                shown = f"(unreadable: {again})"
            raise AssertionError(f"{exc}\nthe page at {page.url} showed:\n{shown}") from exc
        finally:
            browser.close()


def test_every_page_in_chromium(server, tmp_path):
    with _chromium_page(tmp_path) as (page, shots):
        for path, text in PAGES.items():
            page.goto(f"{server}/{path}")
            page.get_by_text(text).first.wait_for(timeout=60_000)
            page.wait_for_load_state("networkidle")
            page.wait_for_function(SETTLED, timeout=60_000)
            name = NAMES.get(path, path)
            page.screenshot(path=str(shots / f"dashboard-{name}.png"))
            assert page.get_by_text("Traceback").count() == 0, name
            _fits(page, name)
            page.set_viewport_size({"width": NARROW, "height": 900})  # the narrow laptop too
            _fits(page, f"{name} at {NARROW} px")
            page.set_viewport_size({"width": 1400, "height": 900})
            if name in ("overview", "tensors"):  # the fault is on the first screen
                assert page.get_by_text("AUX_NOT_FUSED").first.is_visible(), name
            # green marks verdicts only: Streamlit drew inline code (run ids, fault labels) green
            assert not [c for c in page.evaluate(CODE_COLOURS) if c[1] > c[0] + 40 and c[1] > c[2]], name
    assert {f.name for f in shots.glob("dashboard-*.png")} >= {f"dashboard-{NAMES.get(p, p)}.png" for p in PAGES}


def test_dashboard_opened_before_the_engine_writes(tmp_path):
    """`specscope dashboard --db new.db` on a path with no store: the store is created empty, the page
    explains how to instrument an engine, and it switches to the run once one is written; the
    browser fetches nothing from another host (no favicon or font CDN)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    store = tmp_path / "new.db"
    proc, url = _start(store)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                remote: list[str] = []  # the page must work offline: nothing fetched from elsewhere
                page.on("request", lambda r: None if r.url.startswith((url, "data:", "blob:"))
                        else remote.append(r.url))
                page.goto(url)
                page.get_by_text("No run recorded yet").first.wait_for(timeout=60_000)
                write_store(store, [trace("first-run", fault="no-aux-capture")])
                page.get_by_text("AUX_NOT_FUSED").first.wait_for(timeout=60_000)  # no reload
                assert page.get_by_text("Traceback").count() == 0
                assert remote == []
            finally:
                browser.close()
    finally:
        _stop(proc)


def test_stored_text_is_never_markdown(tmp_path):
    """Run ids, engine and model names and request ids are whatever a producer stored: an image in
    them made the viewer's browser fetch its URL, and a colour directive drew a green "no finding" of
    its own (found by an attack trial). Now the Overview and Requests pages show the directive as
    text and fetch nothing."""
    from specscope import events as ev
    from specscope.storage import open_store

    image = "![i](http://127.0.0.9:9/p.png)"
    block = "\n\n# ALL HEALTHY\n\n* it\n\n---\n"  # a heading, a list and a rule, line by line
    run, request = f"run`{image}`x{block}", f"q`{image}"  # within the 64 characters a run name may have
    store = tmp_path / "hostile.db"
    with open_store(str(store)) as s:
        s.write([ev.RunStart(run_id=run, engine=f"eng {image}{block}", engine_version="1", target_model=f"tm {image}",
                             draft_model="dm [link](http://127.0.0.9:9/l) :green[**no finding**]", config={},
                             ts_wall=1_750_000_000.0),
                 ev.RankStart(run_id=run, rank=0, world_size=1, host="h", pid=1, device="cpu", ts_wall=1_750_000_000.0),
                 ev.RequestStart(run_id=run, request_id=request, rank=0, prompt_tokens=3, ts_wall=1_750_000_000.0),
                 ev.VerifyGroup(run_id=run, request_id=request, rank=0, accepted_mask="1000", steps=3, proposed=12,
                                accepted=3, ts_wall=1_750_000_001.0)])  # sampled out of step detail: named
    proc, url = _start(store)
    try:
        with _chromium_page(tmp_path) as (page, _):
            probed: list[str] = []
            page.on("request", lambda r: probed.append(r.url) if "127.0.0.9" in r.url else None)
            for path, shown in (("", ":green[**no finding**]"), ("requests", f"{request} has no step detail")):
                page.goto(f"{url}/{path}")
                page.get_by_text(shown).first.wait_for(timeout=60_000)
                page.wait_for_function(SETTLED, timeout=60_000)
                page.screenshot(path=str(tmp_path / f"hostile-{path or 'overview'}.png"))
                # (a bare URL still becomes a link, as Markdown makes one of it: it fetches nothing)
                assert page.eval_on_selector_all("img", "els => els.filter(e => e.src.includes('127.0.0.9'))"
                                                 ".length") == 0, path
                assert page.get_by_text("Traceback").count() == 0, path
                # a heading or list item of its own (the page's headings name the run, line break and all)
                for element, text in (("h1, h2, h3, h4", "ALL HEALTHY"), ("li", "it")):
                    own = page.locator(element).filter(has_text=re.compile(rf"^\s*{text}\s*$"))
                    assert own.count() == 0, (path, element)
                assert page.locator('[data-testid="stMarkdownContainer"] hr').count() == 0, path
            assert probed == []
    finally:
        _stop(proc)


# the script run is over, and the moved requests are drawn: a table, or the note that none pair up
MOVED_DRAWN = """ && !document.querySelector('[data-testid="stStatusWidget"]')
  && (!!document.querySelector('[data-testid="stDataFrame"] canvas')
      || document.body.innerText.includes('no request to set against another'))"""


def test_overview_compare_gives_the_verdict_in_chromium(server, tmp_path):
    """Overview, "Compare side by side with" the oldest run: the verdict of ``specscope compare`` (its
    difference and interval), the per-position bars of both runs and the requests that moved most,
    drawn in Chromium; screenshot ``dashboard-compare.png``."""
    with _chromium_page(tmp_path) as (page, shots):
        page.goto(server)
        page.wait_for_function(SETTLED, timeout=60_000)
        page.locator('[data-testid="stSelectbox"]').filter(
            has_text="Compare side by side with").click()
        page.get_by_role("option").last.click()
        page.get_by_text("Did acceptance change?").first.wait_for(timeout=60_000)
        page.get_by_text("Per-position acceptance, base vs candidate").first.wait_for(timeout=60_000)
        page.get_by_text("Requests that moved most").first.wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        page.wait_for_function(SETTLED + MOVED_DRAWN, timeout=60_000)
        page.screenshot(path=str(shots / "dashboard-compare.png"))
        assert page.get_by_text("95% CI").first.is_visible()
        assert page.get_by_text("Traceback").count() == 0


# the run picker shows this run (its label ends with the run id)
PICKED = """() => document.querySelector('[data-testid="stSelectbox"] input')?.value.endsWith('%s')"""


def test_a_copied_address_opens_the_same_run_in_chromium(dashboard_store, tmp_path):
    """The address bar names the open run (``?run=``): picked on one page, it stays there on the next,
    Back and Forward return to the runs picked before, and that address opened in a new browser shows
    the same run, not the newest."""
    proc, url = _start(dashboard_store)
    try:
        with _chromium_page(tmp_path) as (page, _):
            page.goto(f"{url}/requests")
            page.wait_for_url("**/requests?run=faulty-run", timeout=60_000)  # the newest run, named
            page.wait_for_function(SETTLED, timeout=60_000)
            page.locator('[data-testid="stSelectbox"]').filter(has_text="Run").first.click()
            page.get_by_role("option").filter(has_text="healthy").click()
            page.wait_for_url("**/requests?run=healthy-run", timeout=60_000)
            page.go_back()  # back to the run open before the pick, and forward again
            page.wait_for_function(PICKED % "faulty-run", timeout=60_000)
            assert page.url.endswith("/requests?run=faulty-run")
            page.go_forward()
            page.wait_for_function(PICKED % "healthy-run", timeout=60_000)
            page.get_by_role("link", name="Findings").click()
            page.wait_for_url("**/findings?run=healthy-run", timeout=60_000)
            copied = page.url
        with _chromium_page(tmp_path) as (page, _):
            page.goto(copied)
            page.get_by_text("Runtime (doctor)").first.wait_for(timeout=60_000)
            page.wait_for_function(SETTLED, timeout=60_000)
            page.screenshot(path=str(tmp_path / "linked-findings.png"))
            assert page.get_by_text("AUX_NOT_FUSED").count() == 0
            assert page.locator('[data-testid="stSelectbox"] input').first.input_value().endswith("healthy-run")
    finally:
        _stop(proc)
