"""Each provisioning marks the job's copy on a broker with a fresh incarnation (``stack.provision``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nebula_mq import topology
from nebula_mq.security.certs import Identity
from nebula_mq.stack.provision import Upstream, definitions
from nebula_mq.transport.job_presence import incarnation_exchange

A, B = "cluster-a", "cluster-b"
FLOWS = topology.abnet_flows(A, B, ("enc-0",))
UPSTREAMS = {B: Upstream(B, "127.0.0.1", 1000, Identity("federation-a", Path("c.pem"), Path("k.pem"), Path("t.pem")))}


def defs(**kw: Any) -> dict[str, Any]:
    return definitions("j", A, FLOWS, ["w"], [B], UPSTREAMS, **kw)


def markers(document: dict[str, Any]) -> list[dict[str, Any]]:
    prefix = incarnation_exchange("j", "")
    return [x for x in document["exchanges"] if str(x["name"]).startswith(prefix)]


def test_every_provisioning_writes_one_internal_marker_of_its_own() -> None:
    first, second = (markers(defs()) for _ in range(2))
    assert len(first) == len(second) == 1 and first[0]["name"] != second[0]["name"]
    assert first[0]["internal"] is True and first[0]["durable"] is True  # nobody can publish into it
    given = markers(defs(incarnation="t1"))
    assert [x["name"] for x in given] == [incarnation_exchange("j", "t1")]
    assert markers(defs(incarnation="")) == []
