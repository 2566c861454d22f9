"""Two hosts, as a user deploys them: each runs its own cluster's broker (``stack up --listen
--hostname``), the hosts exchange CA certificates and CRLs as files, each provisions the job on
its own broker with the peer named by hostname, and ``nebula-mq worker`` alone trains across the
kernel-shaped link between their network namespaces. Brokers and workers see real addresses
and hostnames; nothing crosses on 127.0.0.1."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from nebula_mq import topology
from tests.fixtures.jobs import ABNET_JOB, final_checkpoint, wait_all
from tests.fixtures.netns import CLUSTERS, PORT, Host, broker_hosts

pytestmark = [pytest.mark.broker, pytest.mark.paddle]

def _job_files(hosts: dict[str, Host], stacks: dict[str, Path], tmp: Path, job_id: str) -> dict[str, Path]:
    text = ABNET_JOB.format(job_id=job_id, seed=4, steps=8, run_dir=tmp / "run", batch_size=8, extra="")
    for c in CLUSTERS:
        text += f'\n[clusters.{c}.federation]\nhost = "{hosts[c].hostname}"\nport = {PORT}\n'
    files = {"job": tmp / "job.toml"}
    files["job"].write_text(text)
    for c, worker in zip(CLUSTERS, ("enc-0", "dec-0")):
        cert_dir = stacks[c] / "certs" / c
        ident = cert_dir / "clients" / f"{job_id}.{worker}"
        files[worker] = tmp / f"{worker}.toml"
        files[worker].write_text(text + (
            f'\n[clusters.{c}.broker]\nhost = "{hosts[c].hostname}"\nport = {PORT}\nvhost = "{topology.vhost(job_id)}"\n'
            f'ca_file = "{cert_dir / "trust.pem"}"\ncert_file = "{ident / "cert.pem"}"\nkey_file = "{ident / "key.pem"}"\n'
            f'server_name = "{hosts[c].hostname}"\nheartbeat_s = 10\n'))
    return files


def _metric(path: Path, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_two_hosts_provisioned_apart_train_over_a_kernel_shaped_link(tmp_path: Path) -> None:
    with broker_hosts("th", ("broker-a.nebula.test", "broker-b.nebula.test"), tmp_path) as (hosts, stacks):
        a, b = (hosts[c] for c in CLUSTERS)
        job_id = f"twohosts{os.getpid()}"
        files = _job_files(hosts, stacks, tmp_path, job_id)
        for c in CLUSTERS:
            out = hosts[c].nebula("provision", str(files["job"]), "--cluster", c, "--stack", str(stacks[c]))
            assert f"provisioned on {c}" in out.stdout
        sent_before = a.tx_bytes()
        procs = {"enc-0": a.popen([sys.executable, "-m", "nebula_mq", "worker", "--role", "abnet-encoder",
                                   "--config", str(files["enc-0"])], tmp_path / "w-enc-0.log"),
                 "dec-0": b.popen([sys.executable, "-m", "nebula_mq", "worker", "--role", "abnet-decoder",
                                   "--config", str(files["dec-0"])], tmp_path / "w-dec-0.log")}
        wait_all(procs, tmp_path, "w", timeout=300)
        assert {w: final_checkpoint(tmp_path / "run", w).step for w in procs} == {"enc-0": 8, "dec-0": 8}
        # The activations crossed the veth: host a sent at least what the encoder published.
        published = _metric(tmp_path / "run" / "metrics" / "enc-0.prom", "nebula_wire_bytes_total",
                            flow="activations", direction="out")
        assert published > 10_000 and a.tx_bytes() - sent_before >= published
        # cluster-b's broker pulls from cluster-a's by name, over TLS checked against that name:
        # its federation link is a connection from b's address to a's AMQPS port.
        params = json.loads(b.nebula("provision", str(files["job"]), "--cluster", "cluster-b",
                                     "--dry-run").stdout)["parameters"]
        assert "amqps://broker-a.nebula.test:5671/" in params[0]["value"]["uri"]
        assert "server_name_indication=broker-a.nebula.test" in params[0]["value"]["uri"]
        peers = a.run("ss", "-tnH", "state", "established", f"( sport = :{PORT} )").stdout
        assert f"{b.address}:" in peers, peers
