"""The console script as a new user meets it, in real subprocesses: start-up without torch or
transformers, one line and exit 2 for an unusable store URL, a quiet end when the reader of a pipe
goes away, and run ids given by a unique prefix."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import _traces as T
import pytest

from specscope.cli import BROKEN_PIPE_EXIT, main
from specscope.storage import open_store

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "streamlit", "specscope.engine")
# Runs the CLI in a fresh interpreter, then reports which heavy packages it imported.
PROBE = ("import sys\nfrom specscope.cli import main\ntry:\n    status = main(sys.argv[1:])\n"
         "except SystemExit as exc:\n    status = exc.code\n"
         f"print('IMPORTED', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
         "sys.exit(status)\n")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env,
                          input=stdin, timeout=120)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("cli") / "store.db")
    with open_store(path) as store:
        T.healthy("6554e55cec90aaaa").write(store)
        T.no_aux_capture("6554e55cec90bbbb").write(store)
        T.healthy("ce717545c2e5").write(store)
    return path


@pytest.mark.parametrize("args", [["--version"], ["query", "--db", "{db}", "SELECT 1"],
                                  ["doctor", "--db", "{db}"], ["--help"]])
def test_start_up_imports_neither_torch_nor_transformers(db, args):
    done = cli(*(a.format(db=db) for a in args))
    assert done.returncode in (0, 1), done.stderr
    assert "IMPORTED []" in done.stderr


def test_unknown_url_scheme_is_one_line_and_exit_2():
    done = cli("doctor", "--db", "http://example.com/x.db")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert lines[0].startswith("specscope doctor: error: unsupported database 'http'")


@pytest.mark.parametrize("args", [["query", "--csv", "SELECT * FROM tensor_events"],
                                  ["query", "--json", "SELECT * FROM tensor_events"]])
def test_closed_pipe_ends_quietly(db, args):
    """`specscope ... | head -2`: the reader leaves after two lines while the output (far over a pipe
    buffer) is still being written; no traceback, status 141."""
    command = [sys.executable, "-c", "import sys; from specscope.cli import main; sys.exit(main(sys.argv[1:]))",
               args[0], "--db", db, *args[1:]]
    script = f"{shlex.join(command)} | head -2; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.count("\n") == 2
    assert done.stderr == "" and done.returncode == BROKEN_PIPE_EXIT


def test_run_id_prefix(db, capsys):
    assert main(["doctor", "--db", db, "--run", "ce71"]) == 0
    assert capsys.readouterr().out.startswith("run ce717545c2e5 ")
    assert main(["doctor", "--db", db, "--run", "6554e55cec90b"]) == 1
    assert "AUX_NOT_FUSED" in capsys.readouterr().out


def test_ambiguous_run_id_prefix_names_the_candidates(db, capsys):
    assert main(["doctor", "--db", db, "--run", "6554e55cec90"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "ambiguous" in err and "6554e55cec90aaaa" in err and "6554e55cec90bbbb" in err


def test_prefix_wildcards_are_literal(db, capsys):
    assert main(["doctor", "--db", db, "--run", "%"]) == 2
    assert "no run '%'" in capsys.readouterr().err


def test_inspect_into_a_short_pipe_has_no_traceback(ok_eagle3):
    """`specscope inspect ... | head -3`: whether the reader leaves before or after the last write,
    no traceback; the status is the inspection's or 141."""
    command = [sys.executable, "-c", "import sys; from specscope.cli import main; sys.exit(main(sys.argv[1:]))",
               "inspect", str(ok_eagle3), "--json"]
    done = subprocess.run(["bash", "-c", f"{shlex.join(command)} | head -3; exit ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.count("\n") == 3
    assert done.stderr == "" and done.returncode in (0, BROKEN_PIPE_EXIT)
