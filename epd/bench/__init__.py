"""`epd bench`: a load generator for OpenAI-compatible servers and a side-by-side comparison.

Files, one concern each:
    workloads.py    deterministic requests and images (the same seed gives the same requests)
    results.py      RequestResult: what one request measured (every driver produces these)
    sse.py          parsing an OpenAI chat-completion SSE stream (pure)
    client.py       one streamed request -> a RequestResult
    load.py         closed / open loop drivers, the background loop, progress on stderr
    stats.py        percentiles, summaries, goodput (pure)
    report.py       text tables, JSON, latency-CDF PNG
    hf_baseline.py  plain transformers `generate`, one request at a time, timed by a streamer
    servers.py      start / stop `epd serve` subprocesses with bounded waits
    compare.py      the same requests against hf, colocated, cluster and other servers
    cli.py          `epd bench run` / `epd bench compare` flags (imports nothing heavy)

This package's __init__ stays empty on purpose: `epd` parses every worker's flags through
`epd.cli`, which imports `epd.bench.cli`; nothing heavy may load on that path.
"""
