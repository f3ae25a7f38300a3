"""The fleet: specscope beside Prometheus and Grafana, and many ranks into one store.

- :class:`Watcher` / :func:`watch`: store a server's acceptance from its Prometheus metrics (vLLM,
  SGLang, TensorRT-LLM, llama.cpp), no hooks needed (``specscope watch``). For a check against an
  engine's own counters: ``window(parse_exposition(before)[i], parse_exposition(after)[i])`` gives the
  engine's figures over the same window in specscope's definition.
- :class:`StoreCollector` / :func:`serve_exporter`: the store as a Prometheus target
  (``specscope exporter``); Grafana dashboard and alert rules in ``deploy/``.
"""

from specscope.fleet._conventions import (
    CONVENTIONS,
    Reading,
    Window,
    check_reading,
    is_reset,
    parse_exposition,
    window,
)
from specscope.fleet._exporter import StoreCollector, serve_exporter
from specscope.fleet._watch import ScrapeResult, Watcher, normalize_endpoint, public_endpoint, watch

__all__ = ["CONVENTIONS", "Reading", "ScrapeResult", "StoreCollector", "Watcher", "Window", "check_reading",
           "is_reset", "normalize_endpoint", "parse_exposition", "public_endpoint", "serve_exporter", "watch",
           "window"]
