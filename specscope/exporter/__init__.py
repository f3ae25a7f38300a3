"""The store as a Prometheus target (``specscope exporter``): :class:`StoreCollector` /
:func:`serve_exporter`, a reader of the store beside the dashboard and the doctor; a Grafana
dashboard and alert rules over it in ``deploy/``. (Servers' own Prometheus metrics are read into
the store by :mod:`specscope.adapters.prometheus_watch`.)"""

from specscope.exporter._store_collector import StoreCollector, serve_exporter

__all__ = ["StoreCollector", "serve_exporter"]
