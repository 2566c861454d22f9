"""docker-compose.yml, as docker-compose resolves it for each cluster's project (no engine needed):
the projects share no network, publish only the broker's AMQPS port, and gate each service on the
one before it. ``test_compose.py`` runs them on a real engine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ("cluster-a", "cluster-b")

pytestmark = pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install -y docker-compose")


def _config(cluster: str) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    out = subprocess.run(["docker-compose", "--env-file", f"broker/docker/{cluster}.env", "config"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(yaml.safe_load(out.stdout))


def test_each_cluster_project_publishes_only_its_brokers_amqps_port_on_a_network_of_its_own() -> None:
    configs = {c: _config(c) for c in CLUSTERS}
    subnets = set()
    for cluster, cfg in configs.items():
        services = cfg["services"]
        assert set(services) == {"broker", "provision", "worker"}
        assert [p["target"] for p in services["broker"]["ports"]] == [5671]
        assert "ports" not in services["worker"] and "ports" not in services["provision"]
        subnets.add(cfg["networks"]["cluster"]["ipam"]["config"][0]["subnet"])
        # The peer's hostname leads to this project's gateway: the Docker host, where the peer publishes.
        peer_host, gateway = services["broker"]["extra_hosts"][0].split(":")
        assert gateway == cfg["networks"]["cluster"]["ipam"]["config"][0]["gateway"]
        assert peer_host != services["broker"]["networks"]["cluster"]["aliases"][0]
        # The worker reaches its broker by the name its certificate carries, on its own network.
        worker = services["worker"]["command"]
        assert worker[worker.index("--broker-host") + 1] == services["broker"]["networks"]["cluster"]["aliases"][0]
        assert services["provision"]["network_mode"] == "service:broker"
        assert services["provision"]["depends_on"]["broker"]["condition"] == "service_healthy"
        assert services["worker"]["depends_on"]["provision"]["condition"] == "service_completed_successfully"
        assert all(s.get("init") is True for s in services.values())
    assert len(subnets) == 2
    a, b = (configs[c]["services"]["broker"] for c in CLUSTERS)
    # Each side's federation target is the other's published port.
    assert str(a["ports"][0]["published"]) in configs["cluster-b"]["services"]["provision"]["environment"].values()
    assert str(b["ports"][0]["published"]) in configs["cluster-a"]["services"]["provision"]["environment"].values()


def test_compose_brokers_run_tls_only_with_the_management_api_unpublished() -> None:
    broker = _config("cluster-a")["services"]["broker"]
    cmd = broker["command"]
    assert cmd[:4] == ["nebula-mq", "stack", "up", "--foreground"]
    # The rendered config is the local stack's (listeners.tcp = none, EXTERNAL, mutual TLS): the
    # management API answers on the project's network only, on base + 30.
    assert cmd[cmd.index("--base-port") + 1] == "5671"
    assert "5701" not in str(broker["ports"])
