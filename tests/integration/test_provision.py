"""``nebula-mq provision`` on brokers it reaches only as an administrator of their management API,
with federation to the peer under its real hostname (SNI and certificate check), workers started
by ``nebula-mq worker`` alone, and ``deprovision`` removing the job and nothing else."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nebula_mq import topology
from nebula_mq.security.certs import federation_identity
from tests.fixtures.jobs import ABNET_JOB, final_checkpoint, start_worker, wait_all
from tests.fixtures.stack import StackHandle

pytestmark = [pytest.mark.broker, pytest.mark.paddle]

CLUSTERS = ("cluster-a", "cluster-b")
HOSTNAME = "{}.nebula.test"  # the name each broker's certificate carries (not in DNS: TCP goes to localhost)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nebula_mq", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def admin(stack: StackHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An administrator of both brokers' management API (what an operator gives provisioning)."""
    user, password = f"ops-{os.getpid()}", secrets.token_hex(12)
    secret = tmp_path_factory.mktemp("admin") / "admin.pw"
    secret.write_text(password)
    for c in CLUSTERS:
        stack.stack.rabbitmqctl(c, "add_user", user, password)
        stack.stack.rabbitmqctl(c, "set_user_tags", user, "administrator")
    yield user, secret
    for c in CLUSTERS:
        stack.stack.rabbitmqctl(c, "delete_user", user)


@pytest.fixture(scope="module")
def named_brokers(stack: StackHandle, tmp_path_factory: pytest.TempPathFactory) -> StackHandle:
    """Each broker's certificate names the host peers and workers reach it by (`certs issue --hostname`)."""
    certs = str(stack.stack.layout.certs_dir)
    audit = tmp_path_factory.mktemp("certs") / "audit.jsonl"
    for c in CLUSTERS:
        out = _cli("certs", "issue", certs, c, "server", "--hostname", HOSTNAME.format(c), "--audit", str(audit))
        assert out.returncode == 0, out.stderr
    return stack


def _job_files(stack: StackHandle, tmp: Path, job_id: str) -> dict[str, Path]:
    """The job file, plus one per worker naming its own broker identity (as each host would hold)."""
    from nebula_mq.settings import load_settings
    from workers.plans import plan_for

    certs = stack.stack.layout.certs_dir
    text = ABNET_JOB.format(job_id=job_id, seed=3, steps=8, run_dir=tmp / "run", batch_size=8, extra="")
    for c in CLUSTERS:
        # Each broker's own federation identity, where its host keeps it (the broker reads it).
        fed = tmp / f"fed-{c}"
        fed.mkdir()
        ident = stack.stack.ca(c).client(federation_identity(c))
        for src, dst in ((ident.cert_file, "cert.pem"), (ident.key_file, "key.pem"), (certs / c / "trust.pem", "trust.pem")):
            shutil.copy(src, fed / dst)
        node = stack.stack.layout.node(c)
        text += (f'\n[clusters.{c}.federation]\nhost = "localhost"\nport = {node.relay_port}\n'
                 f'server_name = "{HOSTNAME.format(c)}"\ncert_dir = "{fed}"\n')
    files = {"job": tmp / "job.toml"}
    files["job"].write_text(text)
    plan = plan_for(load_settings(files["job"], environ={}))
    for proc in plan.processes:
        b = stack.stack.broker_settings(proc.cluster, proc.identity(job_id), vhost=topology.vhost(job_id))
        files[proc.worker_id] = tmp / f"{proc.worker_id}.toml"
        files[proc.worker_id].write_text(
            text.replace(f"[clusters.{proc.cluster}.federation]",
                         f'[clusters.{proc.cluster}.broker]\nhost = "127.0.0.1"\nport = {b.port}\n'
                         f'vhost = "{b.vhost}"\nca_file = "{b.ca_file}"\ncert_file = "{b.cert_file}"\n'
                         f'key_file = "{b.key_file}"\nserver_name = "{HOSTNAME.format(proc.cluster)}"\n'
                         f'heartbeat_s = 10\n\n[clusters.{proc.cluster}.federation]'))
    return files


def _admin_args(stack: StackHandle, cluster: str, admin: tuple[str, Path], files: dict[str, Path]) -> list[str]:
    mgmt = stack.stack.layout.node(cluster).mgmt_port
    ident = stack.stack.ca(cluster).ensure_client(f"ops-client-{cluster}")
    return ["--cluster", cluster, "--management-url", f"https://localhost:{mgmt}", "--admin-user", admin[0],
            "--admin-password-file", str(admin[1]), "--ca-file", str(ident.ca_file), "--cert-file",
            str(ident.cert_file), "--key-file", str(ident.key_file)]


def test_a_job_provisioned_by_hostname_trains_with_workers_alone_and_deprovisions_cleanly(
        named_brokers: StackHandle, admin: tuple[str, Path], tmp_path: Path) -> None:
    stack = named_brokers
    job_id = f"prov{os.getpid()}"
    files = _job_files(stack, tmp_path, job_id)
    bystander = stack.new_job(prefix="bys")  # another job on the same brokers: must survive
    for attempt in range(2):  # provisioning twice is harmless
        for c in CLUSTERS:
            out = _cli("provision", str(files["job"]), *_admin_args(stack, c, admin, files))
            assert out.returncode == 0, out.stdout + out.stderr
            assert f"provisioned on {c}" in out.stdout
    upstream = json.loads(stack.stack.rabbitmqctl("cluster-b", "list_parameters", "-p", topology.vhost(job_id),
                                                  "--formatter", "json", "--quiet"))
    assert f"server_name_indication={HOSTNAME.format('cluster-a')}" in json.dumps(upstream)

    procs = {"dec-0": start_worker("abnet-decoder", files["dec-0"], tmp_path / "w-dec-0.log"),
             "enc-0": start_worker("abnet-encoder", files["enc-0"], tmp_path / "w-enc-0.log")}
    wait_all(procs, tmp_path, "w", timeout=240)
    assert {w: final_checkpoint(tmp_path / "run", w).step for w in procs} == {"enc-0": 8, "dec-0": 8}

    for c in CLUSTERS:
        out = _cli("deprovision", str(files["job"]), *_admin_args(stack, c, admin, files))
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"vhost {topology.vhost(job_id)}" in out.stdout and f"user {job_id}." in out.stdout
        vhosts = stack.stack.rabbitmqctl(c, "list_vhosts", "--quiet", "--no-table-headers").split()
        users = stack.stack.rabbitmqctl(c, "list_users", "--quiet", "--no-table-headers")
        assert topology.vhost(job_id) not in vhosts and bystander.vhost in vhosts
        assert f"{job_id}." not in users and topology.monitoring_user(job_id) not in users
        peer = next(p for p in CLUSTERS if p != c)
        assert federation_identity(peer) in users  # it serves every job
        again = _cli("deprovision", str(files["job"]), *_admin_args(stack, c, admin, files))
        assert again.returncode == 0 and "nothing to remove" in again.stdout


def test_provision_says_what_is_wrong_in_one_line(stack: StackHandle, admin: tuple[str, Path], tmp_path: Path) -> None:
    files = _job_files(stack, tmp_path, f"provbad{os.getpid()}")
    bad = tmp_path / "wrong.pw"
    bad.write_text("not-the-password")
    args = _admin_args(stack, "cluster-a", admin, files)
    args[args.index("--admin-password-file") + 1] = str(bad)
    out = _cli("provision", str(files["job"]), *args)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "401" in out.stderr and "administrator" in out.stderr
    # A job that names no address for a peer cannot get its federation upstream.
    text = files["job"].read_text().replace('host = "localhost"', 'host = ""')
    files["job"].write_text(text)
    out = _cli("provision", str(files["job"]), *_admin_args(stack, "cluster-b", admin, files))
    assert out.returncode == 1 and "[clusters.cluster-a.federation].host" in out.stderr, out.stderr


def test_a_worker_of_a_job_nobody_provisioned_says_so_in_one_line(named_brokers: StackHandle, tmp_path: Path) -> None:
    stack = named_brokers
    files = _job_files(stack, tmp_path, f"noprov{os.getpid()}")  # written, never provisioned
    out = subprocess.run([sys.executable, "-m", "nebula_mq", "worker", "--role", "abnet-encoder", "--config",
                          str(files["enc-0"])], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("nebula-mq: error:") and "is the job provisioned" in last and "nebula-mq provision" in last
    assert "Traceback" not in out.stderr
    assert sum('"logger": "pika' in line for line in out.stderr.splitlines()) <= 1, out.stderr
