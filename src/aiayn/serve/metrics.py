"""The server's Prometheus metrics (``GET /metrics``), in a registry of their own."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()
REQUESTS = Counter("aiayn_requests", "requests answered, by endpoint", ["endpoint"], registry=REGISTRY)
TOKENS = Counter("aiayn_generated_tokens", "tokens generated", registry=REGISTRY)
QUEUED = Gauge("aiayn_queued_sequences", "sequences waiting to join the batch", registry=REGISTRY)
RUNNING = Gauge("aiayn_running_sequences", "sequences decoding", registry=REGISTRY)
BATCH = Histogram("aiayn_batch_rows", "rows decoded per step", buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                  registry=REGISTRY)
STEP = Histogram("aiayn_step_seconds", "seconds per batch step", registry=REGISTRY,
                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
TTFT = Histogram("aiayn_time_to_first_token_seconds", "seconds from a request to its first token", registry=REGISTRY,
                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus' text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
