"""``nebula-mq provision --dry-run``: the definitions a remote broker would get, from the job file
alone (peers by hostname, the backpressure cap, the monitoring user), and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula_mq.cli import main

JOB = """
[job]
id = "hosts"
scenario = "abnet"
run_dir = "{run_dir}"

[abnet]
preset = "tiny"
head_cluster = "dc-east"
tail_cluster = "dc-west"

[clusters.dc-east.federation]
host = "mq.east.example.org"
port = 5671
cert_dir = "/etc/rabbitmq/federation"

[clusters.dc-west.federation]
host = "10.1.2.3"
port = 5999
server_name = "mq.west.example.org"
"""


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(run_dir=tmp_path / "run"))
    return path


def _dry(job: Path, cluster: str, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main(["provision", str(job), "--cluster", cluster, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_broker_pulls_from_its_peer_by_hostname_with_its_own_identity(
        job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    west = _dry(job, "dc-west", capsys)  # the decoder's side pulls activations from the east
    [up] = west["parameters"]
    uri = up["value"]["uri"]
    assert uri.startswith("amqps://mq.east.example.org:5671/nebula-hosts?")
    assert "server_name_indication=mq.east.example.org" in uri and "verify=verify_peer" in uri
    # dc-west's own federation identity, where dc-west's broker keeps it (the default directory).
    assert "certfile=/etc/rabbitmq/certs/federation/cert.pem" in uri
    east = _dry(job, "dc-east", capsys)
    [up] = east["parameters"]
    assert up["value"]["uri"].startswith("amqps://10.1.2.3:5999/")
    assert "server_name_indication=mq.west.example.org" in up["value"]["uri"]
    assert "certfile=/etc/rabbitmq/federation/cert.pem" in up["value"]["uri"]
    # The sending side caps its outbound copies (backpressure); the receiving side is uncapped.
    caps = {p["name"]: p for side in (east, west) for p in side["policies"] if "max-length-bytes" in p["definition"]}
    assert set(caps) == {"nebula-hosts-cap"} and "reply" in next(iter(caps.values()))["pattern"]
    users = {u["name"]: u for u in west["users"]}
    assert users["nebula-monitor-hosts"]["tags"] == ["management"]
    assert users["nebula-monitor-hosts"]["password_hash"].startswith("<")  # never printed
    perms = {p["user"]: p for p in west["permissions"]}
    assert {perms["nebula-monitor-hosts"][k] for k in ("configure", "write", "read")} == {"^$"}
    assert not (job.parent / "run" / "monitoring.password").exists()  # a dry run writes nothing


def test_a_missing_peer_address_or_an_unknown_cluster_is_one_clear_line(
        job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job.write_text(job.read_text().replace('host = "mq.east.example.org"', ""))
    assert main(["provision", str(job), "--cluster", "dc-west", "--dry-run"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[clusters.dc-east.federation].host" in err
    assert main(["provision", str(job), "--cluster", "dc-wset", "--dry-run"]) == 1
    assert "did you mean 'dc-west'" in capsys.readouterr().err
    assert main(["provision", str(job), "--cluster", "dc-east"]) == 1
    assert "--admin-password-file" in capsys.readouterr().err
