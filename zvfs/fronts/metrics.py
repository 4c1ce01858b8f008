"""`/.zvfs/metrics`: the served source's figures and the HTTP front's, as Prometheus text
(prometheus_client's exposition format, from a collector read at each scrape: nothing is
counted twice, and the figures are those `/.zvfs/stats` shows)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class _Collector:
    def __init__(self, app):
        self.app = app

    def collect(self):
        stats = self.app.paths.source.stats()
        c = self.app.counters
        info = GaugeMetricFamily("zvfs_info", "the served source (worker: which process of `--workers` answered)",
                                 labels=["version", "source", "view", "worker"])
        info.add_metric([stats["zvfs_version"], stats["source"], str(stats["view"]), str(self.app.worker)], 1)
        yield info
        yield CounterMetricFamily("zvfs_backend_requests", "requests made to the store", value=stats["backend_requests"])
        yield CounterMetricFamily("zvfs_backend_bytes", "bytes read from the store", value=stats["backend_bytes"])
        yield CounterMetricFamily("zvfs_backend_retries", "requests to the store retried", value=stats["retries"])
        hits = CounterMetricFamily("zvfs_cache_hits", "cache hits", labels=["cache"])
        misses = CounterMetricFamily("zvfs_cache_misses", "cache misses", labels=["cache"])
        held = GaugeMetricFamily("zvfs_cache_bytes", "bytes held by a cache", labels=["cache"])
        for name, cache in stats["caches"].items():
            hits.add_metric([name], cache.get("hits", 0))
            misses.add_metric([name], cache.get("misses", 0))
            held.add_metric([name], cache.get("bytes", 0))
        yield from (hits, misses, held)
        requests = CounterMetricFamily("zvfs_http_requests", "HTTP requests answered", labels=["code"])
        for code, n in sorted(c.requests.items()):
            requests.add_metric([str(code)], n)
        yield requests
        yield CounterMetricFamily("zvfs_http_bytes_served", "bytes of files sent", value=c.bytes_served)
        yield CounterMetricFamily("zvfs_http_files_read", "files sent (GET)", value=c.files_read)
        yield GaugeMetricFamily("zvfs_http_in_flight", "requests being answered", value=c.in_flight)


def render(app) -> tuple[bytes, str]:
    registry = getattr(app, "_registry", None)
    if registry is None:
        registry = app._registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(app))
    return generate_latest(registry), CONTENT_TYPE_LATEST
