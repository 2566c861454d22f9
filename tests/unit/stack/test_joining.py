"""What a host does before its workers start (``nebula_mq.stack.joining``), where it can go wrong
without a broker: a peer nobody made this cluster trust, a broker host whose ``up`` never comes."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq import topology
from nebula_mq.errors import CertificateError, SecurityError
from nebula_mq.security.certs import ClusterCA
from nebula_mq.settings import ClusterSettings, FederationSettings, JobSettings, Settings
from nebula_mq.stack import joining
from workers.processes import Plan


class OneClusterStack:
    """A broker host's stack as ``trusted_peers`` reads it: its cluster's CA, on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ca(self, cluster: str) -> ClusterCA:
        return ClusterCA(self.root, cluster)


def test_a_peer_this_cluster_does_not_trust_yet_is_one_line_naming_the_command(tmp_path: Path) -> None:
    settings = Settings(job=JobSettings(id="j", run_dir=str(tmp_path / "run")), clusters={
        "cluster-b": ClusterSettings("cluster-b", federation=FederationSettings(host="b1.example.org", port=5671))})
    plan = Plan((), (topology.Flow("acts", "cluster-a", "cluster-b"),))
    with pytest.raises(CertificateError) as caught:
        joining.trusted_peers(settings, plan, "cluster-a", OneClusterStack(tmp_path / "certs"))
    assert str(caught.value) == ("cluster-a does not trust cluster-b yet: run `nebula-mq stack trust cluster-b "
                                 "b1.example.org:5671 --fingerprint ...` on this host, as cluster-b's `stack up` "
                                 "printed it")


def test_a_rank_host_whose_broker_host_never_comes_says_so_on_the_way_then_gives_up_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(joining, "TELL_EVERY_S", 0.3)
    settings = Settings(job=JobSettings(id="j", run_dir=str(tmp_path / "run")))
    said: list[str] = []
    with pytest.raises(SecurityError) as caught:
        joining.wait_for_job_key(settings, "a1.example.org", wait_s=1.0, say=said.append)
    assert said and all(line.startswith("waiting for the job key that `nebula-mq up` on a1.example.org writes to ")
                        for line in said), said
    assert str(caught.value).startswith(f"no job key at {tmp_path / 'run' / 'keys' / 'job.key'} after 1 s: start "
                                        "`nebula-mq up` on a1.example.org first")
