"""Job provisioning: which queues each cluster federates, and idempotency on real nodes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq import topology
from nebula_mq.errors import StackError
from nebula_mq.security.certs import Identity
from nebula_mq.stack.provision import Upstream, definitions
from nebula_mq.topology import Flow
from tests.fixtures.stack import StackHandle
from workers.electra.flows import electra_flows

CLUSTERS = ("c0", "c1", "c2")
flows_strategy = st.lists(
    st.tuples(st.sampled_from(CLUSTERS), st.sampled_from(CLUSTERS)), min_size=1, max_size=8
).map(lambda pairs: tuple(Flow(f"f{i}", s, d) for i, (s, d) in enumerate(pairs)))


def _upstreams(dst: str) -> dict[str, Upstream]:
    client = Identity(f"federation-{dst}", Path("c.pem"), Path("k.pem"), Path("t.pem"))
    return {src: Upstream(src, "127.0.0.1", 1000 + i, client) for i, src in enumerate(CLUSTERS) if src != dst}


@settings(max_examples=60, deadline=None)
@given(flows=flows_strategy)
def test_each_cluster_federates_exactly_the_flows_that_end_there(flows: tuple[Flow, ...]) -> None:
    for cluster in CLUSTERS:
        defs = definitions("j", cluster, flows, ["w"], [c for c in CLUSTERS if c != cluster], _upstreams(cluster))
        upstream_of = {p["name"]: p for p in defs["parameters"]}
        federated: dict[str, str] = {}
        capped = {q for pol in defs["policies"] if "max-length-bytes" in pol["definition"]
                  for q in (topology.queue_name("j", f.name) for f in flows) if re.match(pol["pattern"], q)}
        # The cap bounds the sending-side copy of each flow that leaves this cluster, and nothing else.
        assert capped == {topology.queue_name("j", f.name) for f in flows
                          if f.crosses_clusters and f.src_cluster == cluster}
        for pol in defs["policies"]:
            if "federation-upstream" not in pol["definition"]:
                continue
            up = pol["definition"]["federation-upstream"]
            assert up in upstream_of
            for f in flows:
                q = topology.queue_name("j", f.name)
                if re.match(pol["pattern"], q):
                    assert q not in federated, "two policies match one queue"
                    federated[q] = up
        expected = {topology.queue_name("j", f.name): topology.upstream_name(f.src_cluster)
                    for f in flows if f.crosses_clusters and f.dst_cluster == cluster}
        assert federated == expected


def test_upstream_uses_the_relay_and_loss_safe_link_settings() -> None:
    flows = topology.abnet_flows("c0", "c1", ("e",))
    defs = definitions("j", "c1", flows, [], ["c0"], _upstreams("c1"))
    (param,) = defs["parameters"]
    value = param["value"]
    assert value["uri"].startswith("amqps://127.0.0.1:1000/nebula-j?")
    assert "verify=verify_peer" in value["uri"] and "auth_mechanism=external" in value["uri"]
    assert (value["ack-mode"], value["resource-cleanup-mode"]) == ("on-confirm", "never")
    assert value["prefetch-count"] <= 32


@pytest.mark.broker
def test_provisioning_is_idempotent(stack: StackHandle) -> None:
    job = stack.new_job()

    def snapshot() -> dict[str, list[str]]:
        out = {}
        for c in ("cluster-a", "cluster-b"):
            defs = json.loads(stack.stack.rabbitmqctl(c, "export_definitions", "-", "--format", "json", "--quiet"))
            for key in ("policies", "parameters", "permissions", "users"):
                rows = [r for r in defs[key] if r.get("vhost", job.vhost) == job.vhost]
                out[f"{c}/{key}"] = sorted(json.dumps(r, sort_keys=True) for r in rows)
        assert out["cluster-b/policies"] and out["cluster-b/parameters"]
        return out

    before = snapshot()
    assert stack.stack.provision_job(job.job_id, job.flows, job.identities) == job.vhost
    assert snapshot() == before


@pytest.mark.broker
def test_bad_job_or_cluster_is_a_stack_error(stack: StackHandle) -> None:
    with pytest.raises(StackError):
        stack.stack.provision_job("Bad Job", topology.abnet_flows("cluster-a", "cluster-b", ("e",)))
    with pytest.raises(StackError):
        stack.stack.provision_job("ok", topology.abnet_flows("cluster-a", "cluster-z", ("e",)))


@pytest.mark.broker
def test_the_stack_administers_its_nodes_through_the_management_api(stack: StackHandle, tmp_path: Path) -> None:
    """Provisioning a job on the local stack is a request to each node's management API, not an
    Erlang VM per ``rabbitmqctl`` call; the administrator's password is kept 0600 beside the node
    (as is the config holding it). A node rendered before the password was kept (or without a
    management port) is still administered, through ``rabbitmqctl``."""
    from dataclasses import replace

    from nebula_mq.stack import node as nodes
    from nebula_mq.stack.admin import CtlAdmin, HttpAdmin, local_admin

    n = stack.stack.layout.node("cluster-a")
    admin = stack.stack.admin("cluster-a")
    assert isinstance(admin, HttpAdmin)
    for private in (nodes.admin_password_file(n), n.config_file):
        assert private.stat().st_mode & 0o777 == 0o600, private
    job = stack.new_job(prefix="adm")
    assert job.vhost in admin.users_of().get(job.identities["cluster-a"][0], [])
    older = replace(n, dir=str(tmp_path))  # no admin.password there
    assert isinstance(local_admin(older, stack.stack.ca("cluster-a"), "127.0.0.1"), CtlAdmin)
    assert isinstance(local_admin(replace(n, mgmt_port=0), stack.stack.ca("cluster-a"), "127.0.0.1"), CtlAdmin)
