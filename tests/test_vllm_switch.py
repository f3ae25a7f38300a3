"""The plugin's switches on a live process, without starting vLLM: ``paused()`` takes what specscope
put into vLLM out and back, ``configure()`` changes the running audit, ``flush()`` writes what was
recorded."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from test_vllm_runner import _config

from specscope.adapters import vllm as plugin
from specscope.adapters.vllm import _session
from specscope.adapters.vllm._swap import Swap
from specscope.errors import ConfigError
from specscope.storage import open_store


class Verifier:
    def forward(self) -> str:
        return "vllm"


def test_a_swap_takes_out_only_what_specscope_left_there():
    class Scheduler:
        def add_request(self) -> str:
            return "vllm"

    on_class = Swap(Scheduler, "add_request", lambda self: "specscope")
    verifier = Verifier()
    on_instance = Swap(verifier, "forward", lambda: "specscope")
    assert (Scheduler().add_request(), verifier.forward()) == ("specscope", "specscope")
    for swap in (on_class, on_instance):
        swap.take_out()
        swap.take_out()
    assert (Scheduler().add_request(), verifier.forward()) == ("vllm", "vllm")
    assert "forward" not in vars(verifier)  # the instance takes vLLM's method from its class again
    on_class.put_back()
    assert Scheduler().add_request() == "specscope"
    Scheduler.add_request = lambda self: "someone else"  # wrapped after us: ours can no longer come out
    on_class.take_out()
    on_class.put_back()
    assert Scheduler().add_request() == "someone else"


def test_paused_configure_and_flush_act_on_the_live_run(monkeypatch, tmp_path):
    db = str(tmp_path / "switch.db")
    monkeypatch.setenv("SPECSCOPE_DB", db)
    monkeypatch.setenv("SPECSCOPE_RUN_ID", "switch")
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.32.0"))
    config = _config(use_v2_model_runner=True)
    config.model_config.enforce_eager = True
    session = _session.session(config, has_model=False)
    verifier = Verifier()
    session.attached(Swap(verifier, "forward", lambda: "specscope"))
    try:
        with plugin.paused():
            with plugin.paused():
                assert verifier.forward() == "vllm"
            assert verifier.forward() == "vllm"  # the outermost block switches
        assert verifier.forward() == "specscope"
        plugin.configure(audit_every=1, token_requests=2)
        assert session.tracer.audit_due() and session.tracer.tokens.left == 2
        with pytest.raises(ConfigError):
            plugin.configure(audit_every=-1)
        session.tracer.start_request("r0", prompt_tokens=3)
        assert plugin.flush(10.0)
        with open_store(db, read_only=True) as store:
            _, rows = store.query("SELECT count(*) FROM requests WHERE run_id = 'switch'")
        assert rows == [(1,)]
    finally:
        plugin.close()
    assert verifier.forward() == "vllm"


def test_paused_takes_specscope_out_of_a_process_that_observes_a_compiled_target(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSCOPE_DB", str(tmp_path / "switch.db"))
    monkeypatch.setenv("SPECSCOPE_RUN_ID", "compiled")
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.32.0"))
    session = _session.session(_config(use_v2_model_runner=True), has_model=False)  # mode 3: compiled
    verifier = Verifier()
    session.attached(Swap(verifier, "forward", lambda: "specscope"))
    try:
        assert session.tracer.compiled
        with plugin.paused():  # the compiled models' wrappers stay in place (test_instrumentation_compile)
            assert verifier.forward() == "vllm"
        assert verifier.forward() == "specscope"
    finally:
        plugin.close()


def test_a_wrapped_method_hands_over_its_arguments_by_name_however_called():
    """The per-step wrappers read vLLM's arguments by name: positional or keyword, defaults filled
    in, and a signature with ``*args`` / ``**kwargs`` read as ``inspect`` binds it."""
    from specscope.adapters.vllm import _patches

    class Scheduler:
        def stats(self, drafts, accepted, request_id="r0"):
            return drafts

        def loose(self, *args, **kwargs):
            return args

    seen = []
    for name in ("stats", "loose"):
        _patches._wrap(Scheduler, name, seen.append)
    try:
        scheduler = Scheduler()
        assert scheduler.stats(3, accepted=2, request_id="r1") == 3
        scheduler.stats(4, 1)
        scheduler.stats(drafts=5, accepted=0)
        scheduler.loose(1, 2, x=3)
        assert seen == [{"self": scheduler, "drafts": 3, "accepted": 2, "request_id": "r1"},
                        {"self": scheduler, "drafts": 4, "accepted": 1, "request_id": "r0"},
                        {"self": scheduler, "drafts": 5, "accepted": 0, "request_id": "r0"},
                        {"self": scheduler, "args": (1, 2), "kwargs": {"x": 3}}]
    finally:
        for swap in _patches._swaps[-2:]:
            swap.take_out()
        del _patches._swaps[-2:]
