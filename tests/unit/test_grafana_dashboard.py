"""deploy/grafana/epd-dashboard.json is a Grafana dashboard: JSON, unique panel ids, a Prometheus
datasource variable every query uses; and the metric names its PromQL reads (checked against a
real scrape in tests/e2e/test_dashboard_metrics.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "epd-dashboard.json"
_NAME = re.compile(r"\bepd_[a-z0-9_]+")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def metric_names() -> set[str]:
    """Every `epd_*` series name any panel's PromQL reads."""
    return {name for expr in expressions() for name in _NAME.findall(expr)}


def test_dashboard_is_valid_with_unique_ids_and_a_datasource_variable():
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    refs = [(p["id"], t["refId"]) for p in board["panels"] for t in p["targets"]]
    assert len(refs) == len(set(refs))


def test_dashboard_covers_each_area_of_the_issue():
    names = metric_names()
    for wanted in ["epd_requests_total", "epd_ttft_seconds_bucket", "epd_inter_token_seconds_bucket",
                   "epd_queue_depth", "epd_kv_blocks_used", "epd_kv_blocks_total", "epd_batch_size_bucket",
                   "epd_step_seconds_bucket", "epd_scheduler_preemptions_total", "epd_transfer_bytes_total",
                   "epd_workers"]:
        assert wanted in names, wanted


def test_name_extraction_finds_series_inside_promql():
    assert _NAME.findall("histogram_quantile(0.9, sum by (le) (rate(epd_ttft_seconds_bucket[5m])))") == \
        ["epd_ttft_seconds_bucket"]
