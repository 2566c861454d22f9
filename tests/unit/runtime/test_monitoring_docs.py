"""docs/monitoring: the Grafana dashboard only queries series a worker exports, with labels it
sets, and the scrape config keeps the series' own job label."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from nebula_mq.runtime.hooks import MessageEvent
from nebula_mq.runtime.metrics import IDENTITY, MetricsHook

DOCS = Path(__file__).resolve().parents[3] / "docs" / "monitoring"


def exported(tmp_path: Path) -> tuple[set[str], set[str]]:
    """Sample names and label names a worker's metrics hook exports once it has done some work."""
    hook = MetricsHook("abnet-decoder", tmp_path / "w.prom", identity={"job": "j", "worker": "dec-0", "cluster": "b"})
    event = MessageEvent("activations", raw_bytes=100, wire_bytes=40, redelivered=True)
    hook.on_received(event)
    hook.on_published(MessageEvent("reply-enc-0", raw_bytes=100, wire_bytes=30))
    hook.on_duplicate(event)
    hook.on_dead_letter(event, "malformed", "x")
    hook.on_queue_depth("nebula.j.activations", 3, 4096)
    hook.on_compute(0.5)
    hook.on_wait(0.1)
    hook.on_step(1, {"loss": 2.0})
    samples = [s for f in text_string_to_metric_families((tmp_path / "w.prom").read_text()) for s in f.samples]
    return {s.name for s in samples}, {k for s in samples for k in s.labels}


def test_the_dashboard_queries_only_what_workers_export(tmp_path: Path) -> None:
    names, labels = exported(tmp_path)
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    used = {m for e in exprs for m in re.findall(r"nebula_[a-z_]+", e)}
    assert used <= names, used - names
    grouped = {g.strip() for e in exprs for by in re.findall(r"by \(([^)]*)\)", e) for g in by.split(",")}
    legends = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"{{(\w+)}}", t["legendFormat"])}
    assert grouped | legends <= labels, (grouped | legends) - labels
    assert set(IDENTITY) <= labels


def test_the_scrape_config_keeps_the_series_own_job_label() -> None:
    text = (DOCS / "prometheus.yml").read_text()
    assert "honor_labels: true" in text and "localhost:9300" in text
