"""`specscope dashboard`: refusals before any server starts, and the streamlit command line. (A store
that does not exist yet is created and served: tests/test_dashboard_browser.py.)"""

from __future__ import annotations

import sys

from specscope.app import ENTRY
from specscope.cli import main
from specscope.cli.dashboard import streamlit_command


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
