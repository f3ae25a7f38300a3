"""`specscope dashboard`: refusals before any server starts, and the streamlit command line. (A store
that does not exist yet is created and served: tests/test_dashboard_browser.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import _traces
import httpx
import pytest

from specscope.app import ENTRY
from specscope.cli import main
from specscope.cli.dashboard import streamlit_command
from specscope.storage import open_store


def test_not_a_store_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert main(["dashboard", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "specscope dashboard: error:" in err


def test_streamlit_command_is_headless_same_interpreter():
    command = streamlit_command("127.0.0.1", 8765)
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", str(ENTRY)]
    options = dict(zip(command[5::2], command[6::2]))
    assert options["--server.headless"] == "true" and options["--browser.gatherUsageStats"] == "false"
    assert options["--server.port"] == "8765" and options["--server.address"] == "127.0.0.1"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_dashboard_stops_cleanly_on_sigterm_and_sigint(tmp_path, stop):
    """`specscope dashboard` is the Streamlit server (exec'd): a service manager's SIGTERM or Ctrl-C's
    SIGINT stops it with exit 0 and no traceback, and frees the port."""
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        _traces.healthy().write(store)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/_stcore/health"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "specscope", "dashboard", "--db", path, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        while not _healthy(url):  # until the server answers (pytest-timeout bounds this loop)
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in out + err
    assert not _healthy(url)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
