"""`nebula-mq run` plans its local stack from the job: every cluster the job's plan uses."""

from __future__ import annotations

from pathlib import Path

from nebula_mq.launch import JobProcesses

ROOT = Path(__file__).resolve().parents[3]


def test_an_m3_job_gets_a_third_cluster_and_a_two_cluster_job_the_default_two(tmp_path: Path) -> None:
    m3 = JobProcesses(str(ROOT / "config" / "electra-m3.toml"), str(tmp_path / "m3"))
    assert m3.stack.clusters == ("cluster-a", "cluster-b", "cluster-c")
    assert {p.cluster for p in m3.plan.processes} == {"cluster-a", "cluster-b", "cluster-c"}
    tiny = JobProcesses(str(ROOT / "config" / "electra-tiny.toml"), str(tmp_path / "tiny"))
    assert tiny.stack.clusters == ("cluster-a", "cluster-b")


def test_run_metrics_port_gives_each_worker_its_own_port(tmp_path: Path) -> None:
    job = JobProcesses(str(ROOT / "config" / "electra-tiny.toml"), str(tmp_path / "tiny"), metrics_port_base=9300)
    ports = job.metrics_ports()
    assert sorted(ports.values()) == list(range(9300, 9300 + len(job.plan.processes)))
    for worker, port in ports.items():
        cmd = job.command(worker)
        assert cmd[cmd.index("--metrics-port") + 1] == str(port)
    assert "--metrics-port" not in JobProcesses(str(ROOT / "config" / "electra-tiny.toml"),
                                                str(tmp_path / "tiny")).command(worker)
