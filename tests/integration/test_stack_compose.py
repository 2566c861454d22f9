"""docker-compose.yml is valid for Debian's docker-compose and agrees with the certificate layout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nebula_mq.security.certs import ClusterCA
from nebula_mq.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install -y docker-compose")
def test_compose_file_passes_docker_compose_config() -> None:
    out = subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_compose_brokers_are_tls_only_with_certificate_login() -> None:
    conf = dict(
        line.split(" = ", 1)
        for line in (ROOT / "broker/docker/rabbitmq.conf").read_text().splitlines()
        if " = " in line and not line.startswith("#")
    )
    assert conf["listeners.tcp"] == "none"
    assert conf["ssl_options.fail_if_no_peer_cert"] == "true"
    assert conf["ssl_options.verify"] == "verify_peer"
    assert {conf["ssl_options.versions.1"], conf["ssl_options.versions.2"]} == {"tlsv1.2", "tlsv1.3"}
    assert conf["auth_mechanisms.1"] == "EXTERNAL"


def test_compose_worker_settings_point_at_certs_init_paths() -> None:
    settings = load_settings(ROOT / "broker/docker/job.toml")
    for name, cluster in settings.clusters.items():
        b = cluster.broker
        b.validate()
        ident = ClusterCA("/certs", name).client(Path(b.cert_file).parent.name)
        assert (b.cert_file, b.key_file, b.ca_file) == (str(ident.cert_file), str(ident.key_file), str(ident.ca_file))
        assert b.server_name == name and b.host == name
