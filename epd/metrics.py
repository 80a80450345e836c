"""The core Prometheus metrics of DESIGN.md, one definition each, shared by every process.

Counters are declared without `_total`; the client appends it, so `epd_requests` is exposed as
`epd_requests_total`.

Every process registers the same names on the default registry; each process only moves the
series that concern it (labels say which role or transfer kind). Module-level objects are the
Prometheus client's own idiom: a metric is a process-wide singleton by nature.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

# `*_created` series double the exposition and no dashboard of ours reads them.
disable_created_metrics()

# Latency buckets from 1 ms to 2 minutes: tiny CPU models answer in ms, big ones on a queue in s.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

REQUESTS = Counter("epd_requests", "Requests finished, by role and outcome", ["role", "status"])
TTFT = Histogram("epd_ttft_seconds", "Router: request arrival to first token sent", buckets=_LATENCY_BUCKETS)
INTER_TOKEN = Histogram("epd_inter_token_seconds", "Router: gap between consecutive streamed tokens",
                        buckets=_LATENCY_BUCKETS)
E2E = Histogram("epd_e2e_seconds", "Router: request arrival to last token sent", buckets=_LATENCY_BUCKETS)

QUEUE_DEPTH = Gauge("epd_queue_depth", "Requests (or images, on encoders) waiting for the model", ["role"])
RUNNING = Gauge("epd_running_requests", "Requests being worked on now", ["role"])

KV_BLOCKS_USED = Gauge("epd_kv_blocks_used", "KV cache blocks held by requests", ["role"])
KV_BLOCKS_TOTAL = Gauge("epd_kv_blocks_total", "KV cache blocks this worker can hold", ["role"])
BATCH_SIZE = Histogram("epd_batch_size", "Sequences in one engine forward", ["role"],
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
# Engine steps: a decode step of a tiny CPU model takes ~1 ms, a long prompt chunk of a big one seconds.
STEP_SECONDS = Histogram("epd_step_seconds", "One engine step (schedule, forward, sampling), by role and kind: "
                         "decode (one token a sequence) or prompt (prompt tokens among them)", ["role", "kind"],
                         buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0))
PACED_SECONDS = Counter("epd_decode_paced_seconds", "Time decode steps waited while other processes kept this "
                        "worker's CPUs busy (--decode-step-interval-ms)", ["role"])
PREEMPTIONS = Counter("epd_scheduler_preemptions", "Sequences preempted (blocks freed, to be recomputed)", ["role"])

EMBEDDING_CACHE_HITS = Counter("epd_embedding_cache_hits", "Images whose embeddings were already held", ["role"])
EMBEDDING_CACHE_MISSES = Counter("epd_embedding_cache_misses", "Images whose embeddings had to be computed or pulled",
                                 ["role"])
EMBEDDING_CACHE_BYTES = Gauge("epd_embedding_cache_bytes", "Bytes of embeddings held in the cache", ["role"])

LEASES_ACTIVE = Gauge("epd_leases_active", "Transfer handles issued and not yet released or expired", ["kind"])
SHM_SEGMENTS_ACTIVE = Gauge("epd_shm_segments_active", "Shared-memory segments this process owns")
TRANSFER_BYTES = Counter("epd_transfer_bytes", "Tensor bytes moved by the transfer layer", ["kind", "backend"])
TRANSFER_SECONDS = Histogram("epd_transfer_seconds", "Time of one transfer (all tensors behind one handle)",
                             ["kind", "backend"], buckets=_LATENCY_BUCKETS)

ENCODER_BATCH_SIZE = Histogram("epd_encoder_batch_size", "Images per vision-tower forward",
                               buckets=(1, 2, 4, 8, 16, 32, 64))
REAPED = Counter("epd_reaped", "Leases freed by their TTL rather than by an ack", ["kind"])
WORKERS = Gauge("epd_workers", "Router: workers it knows, by role and state", ["role", "state"])


def serve_metrics(host: str, port: int) -> int:
    """Start the Prometheus exposition server in a daemon thread; returns the bound port (port 0 picks one)."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)
