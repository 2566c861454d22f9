"""Per-role broker permissions: exact regexes from the topology, least privilege."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_mq import topology
from nebula_mq.errors import StackError
from nebula_mq.security.roles import (NOTHING, WorkerIdentity, federation_permissions, permissions,
                                      status_reader_permissions)
from nebula_mq.stack.provision import definitions, publish_path
from tests.fixtures.roles import decoder, encoder, generator, root_discriminator, sub_discriminator
from workers.electra.flows import electra_flows

A, B = "cluster-a", "cluster-b"
FLOWS = topology.abnet_flows(A, B, ("enc-0", "enc-1"))


def _allows(regex: str, name: str) -> bool:
    return re.fullmatch(regex, name) is not None


def test_encoder_publishes_activations_and_reads_only_its_replies() -> None:
    p = permissions("j", encoder("enc-0"), FLOWS)
    q = lambda f: topology.queue_name("j", f)  # noqa: E731
    dlq = topology.dead_letter_queue("j")
    x = lambda f: topology.flow_exchange("j", f)  # noqa: E731
    # Publishing is checked on the exchange: only the activations exchange and the dead-letter one.
    assert _allows(p.write, x("activations")) and _allows(p.write, topology.dead_letter_exchange("j"))
    assert not _allows(p.write, "amq.default") and not _allows(p.write, "")
    assert not _allows(p.write, x("reply-enc-0")) and not _allows(p.write, x("reply-enc-1"))
    # No write on any queue: it cannot bind a queue to an exchange it may publish to.
    assert not any(_allows(p.write, q(f)) for f in ("activations", "reply-enc-0", "reply-enc-1")) and not _allows(p.write, dlq)
    assert _allows(p.read, q("reply-enc-0"))
    assert not _allows(p.read, q("activations")) and not _allows(p.read, q("reply-enc-1"))
    assert not _allows(p.read, dlq)
    assert p.read == "^(" + re.escape(q("reply-enc-0")) + ")$"


def test_decoder_reads_activations_and_writes_every_reply() -> None:
    p = permissions("j", decoder("dec-0", ["enc-0", "enc-1"]), FLOWS)
    q = lambda f: topology.queue_name("j", f)  # noqa: E731
    assert _allows(p.read, q("activations")) and not _allows(p.read, q("reply-enc-0"))
    x = lambda f: topology.flow_exchange("j", f)  # noqa: E731
    assert _allows(p.write, x("reply-enc-0")) and _allows(p.write, x("reply-enc-1"))
    assert not _allows(p.write, x("activations")) and not _allows(p.write, "amq.default")


@given(job=st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True), n_sub=st.integers(1, 4),
       other=st.from_regex(r"[a-z0-9.\-]{1,40}", fullmatch=True))
def test_electra_roles_never_reach_other_queues_or_jobs(job: str, n_sub: int, other: str) -> None:
    flows = electra_flows(A, B, n_sub)
    roles = [generator("gen"), root_discriminator("disc", n_sub), *(sub_discriminator(f"s{i}", i) for i in range(n_sub))]
    for role in roles:
        p = permissions(job, role, flows)
        allowed = {topology.queue_name(job, f) for f in (*role.publishes, *role.consumes)}
        allowed |= {topology.flow_exchange(job, f) for f in role.publishes}
        allowed |= {topology.dead_letter_queue(job), topology.dead_letter_exchange(job)}
        for regex in (p.configure, p.write, p.read):
            assert not _allows(regex, other) or other in allowed
            # Another job's queue of the same flow is never allowed.
            assert not _allows(regex, topology.queue_name(job + "x", "gen-results"))
        assert all(_allows(p.read, topology.queue_name(job, f)) for f in role.consumes)
        assert all(_allows(p.write, topology.flow_exchange(job, f)) for f in role.publishes)
        assert not _allows(p.write, "amq.default")
        # Exchange names never match a configure or read regex (those apply to exchanges too).
        assert not any(_allows(r, topology.flow_exchange(job, f.name)) for f in flows for r in (p.configure, p.read))


def test_unknown_flow_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not in job"):
        permissions("j", WorkerIdentity("w", consumes=("nope",)), FLOWS)
    with pytest.raises(StackError, match="not in job"):
        definitions("j", A, FLOWS, [WorkerIdentity("w", consumes=("nope",))], [B], {})


def test_federation_user_may_only_pull_outbound_flows() -> None:
    on_a = federation_permissions("j", FLOWS, A, B)  # cluster-b's broker pulling from cluster-a
    assert _allows(on_a.read, topology.queue_name("j", "activations"))
    assert not _allows(on_a.read, topology.queue_name("j", "reply-enc-0"))
    # Writes only into its own status link's buffer (declared by the link, bound to the status
    # exchange), never into a flow's queue or exchange.
    link = f"federation: {topology.status_exchange('j')} -> rabbit@host B"
    assert _allows(on_a.write, link) and _allows(on_a.configure, link) and _allows(on_a.read, link)
    assert _allows(on_a.read, topology.status_exchange("j"))
    for name in (topology.queue_name("j", "activations"), topology.flow_exchange("j", "activations"),
                 topology.status_exchange("j"), topology.status_stream("j")):
        assert not _allows(on_a.write, name), name
    on_b = federation_permissions("j", FLOWS, B, A)
    assert _allows(on_b.read, topology.queue_name("j", "reply-enc-1"))
    assert not _allows(on_b.read, topology.queue_name("j", "activations"))


def test_a_worker_publishes_its_status_and_the_reader_only_reads_the_feed() -> None:
    enc = permissions("j", encoder("enc-0"), FLOWS)
    assert _allows(enc.write, topology.status_exchange("j")) and not _allows(enc.read, topology.status_stream("j"))
    reader = status_reader_permissions("j")
    assert _allows(reader.read, topology.status_stream("j"))
    assert reader.write == reader.configure == NOTHING
    assert not _allows(reader.read, topology.queue_name("j", "activations"))


def test_identity_is_a_plain_cn_everywhere_else() -> None:
    ident = encoder("enc-0")
    assert ident == "enc-0" and isinstance(ident, str) and f"{ident}" == "enc-0"
    back = pickle.loads(pickle.dumps(ident))
    assert back.consumes == ("reply-enc-0",) and back.publishes == ("activations",)


def test_job_wide_identity_may_publish_through_every_route() -> None:
    p = permissions("j", "inspector", FLOWS)
    for f in FLOWS:
        assert _allows(p.write, topology.flow_exchange("j", f.name))
    assert _allows(p.write, topology.dead_letter_exchange("j")) and _allows(p.write, "amq.default")


def test_each_cluster_routes_exactly_the_flows_published_there() -> None:
    flows = (*FLOWS, topology.Flow("local", A, A))
    for cluster in (A, B):
        defs = publish_path("j", cluster, flows, max_queue_bytes=1 << 21)
        published = {f.name for f in flows if f.src_cluster == cluster}
        want = {topology.queue_name("j", f) for f in published} | {topology.dead_letter_queue("j")}
        assert {(b["source"], b["destination"], b["routing_key"]) for b in defs["bindings"]} == {
            (topology.exchange_for_queue(q), q, q) for q in want}
        assert {x["name"] for x in defs["exchanges"]} == {topology.exchange_for_queue(q) for q in want}
        assert all(x["type"] == "direct" and x["durable"] for x in defs["exchanges"])
        queues = {q["name"]: q["arguments"] for q in defs["queues"]}
        assert set(queues) == want
        for name, args in queues.items():
            # Exactly what the workers' declares carry (transport.declare), or they fail with 406.
            assert args["x-queue-mode"] == "lazy" and args["x-queue-type"] == "classic"
            capped = name == topology.queue_name("j", "local")
            assert ("x-max-length-bytes" in args) == capped
            if capped:
                assert (args["x-max-length-bytes"], args["x-overflow"]) == (1 << 21, "reject-publish")


def test_exchange_names_stay_out_of_the_queue_namespace() -> None:
    assert topology.exchange_for_queue(topology.queue_name("j", "activations")) == topology.flow_exchange("j", "activations")
    for bad in ("amq.gen-1", "nebula.j", "nebula.J.x", "other.j.activations", ""):
        with pytest.raises(ValueError):
            topology.exchange_for_queue(bad)


def test_only_a_role_that_consumes_may_publish_dead_letters() -> None:
    """A consumer condemns what it receives (the transport republishes it to the dead-letter
    exchange with the reason); a role that only publishes has nothing to condemn."""
    dlx = topology.dead_letter_exchange("j")
    publisher = permissions("j", WorkerIdentity("pub-0", publishes=("activations",)), FLOWS)
    assert not _allows(publisher.write, dlx) and _allows(publisher.write, topology.flow_exchange("j", "activations"))
    assert not _allows(publisher.write, topology.dead_letter_queue("j")) and not _allows(publisher.write, "amq.default")
    consumer = permissions("j", WorkerIdentity("dec-0", consumes=("activations",)), FLOWS)
    assert _allows(consumer.write, dlx) and not _allows(consumer.write, topology.dead_letter_queue("j"))
