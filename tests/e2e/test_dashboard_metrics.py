"""Every metric the Grafana dashboard queries exists in a real /metrics scrape of a running cluster."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image
from tests.unit.test_grafana_dashboard import metric_names

_SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def exposed_names(text: str) -> set[str]:
    """Series names a Prometheus server would store from this exposition: every sample's name, and
    for a family declared without samples yet (a labelled counter nothing has moved) its series."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, [""]))
    return names


def test_exposed_names_follow_the_exposition_types():
    text = "# TYPE epd_x counter\n# TYPE epd_h histogram\nepd_h_bucket{le=\"+Inf\"} 1\nepd_h_count 1\nepd_h_sum 2\n"
    assert exposed_names(text) == {"epd_x_total", "epd_h_bucket", "epd_h_sum", "epd_h_count"}


@pytest.fixture(scope="module")
def cluster(e2e_dirs):
    running = start_cluster(e2e_dirs["kimi_k25"])
    yield running
    running.stop()


def test_every_dashboard_metric_is_scraped(cluster):
    client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="kimi_k25", messages=openai_messages([data_url(pattern_image(3))]),
                                           max_tokens=8, temperature=0, stream=True)
    assert sum(1 for chunk in reply if chunk.choices and chunk.choices[0].delta.content) >= 1
    workers = httpx.get(f"{cluster.url}/workers", timeout=10).json()["workers"]
    assert sorted(w["role"] for w in workers) == ["decode", "encoder", "prefill"]
    urls = [f"{cluster.url}/metrics", *(w["metrics_url"] for w in workers)]
    scraped: set[str] = set()
    for url in urls:
        scraped |= exposed_names(httpx.get(url, timeout=10).text)
    wanted = metric_names()
    assert wanted, "the dashboard reads no epd_* metric"
    assert wanted <= scraped, f"queried by the dashboard but not exposed: {sorted(wanted - scraped)}"
    # histograms have samples after one request, so their quantile panels show data
    router = httpx.get(f"{cluster.url}/metrics", timeout=10).text
    assert any(line.startswith("epd_ttft_seconds_count ") and float(line.split()[1]) >= 1
               for line in router.splitlines())
