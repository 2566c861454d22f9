"""Striped flows (``topology.stripe_flows``): names, bounds, placement of micro-batches, and the
permissions a striped plan grants."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_mq import topology
from nebula_mq.security.roles import WorkerIdentity, permissions
from nebula_mq.settings import JobSettings, Settings
from workers.split.plan import side_processes
from workers.split.job import Placement

A, B = "cluster-a", "cluster-b"


def test_one_stripe_is_the_plain_layout_and_more_stripes_add_named_queues() -> None:
    flow = topology.Flow("activations", A, B)
    assert topology.stripe_flows(flow) == (flow,)
    striped = topology.Flow("activations", A, B, stripes=3)
    stripes = topology.stripe_flows(striped)
    assert [s.name for s in stripes] == ["activations", "activations-s1", "activations-s2"]
    assert stripes[0] is striped  # stripe 0 is the flow itself: its queue keeps its name
    assert all((s.src_cluster, s.dst_cluster, s.kind) == (A, B, striped.kind) for s in stripes)
    assert all(s.stripes == 1 for s in stripes[1:])
    assert len({topology.queue_name("j", s.name) for s in topology.physical_flows([striped, flow])}) == 3


@given(stripes=st.integers(1, topology.MAX_STRIPES), micro_batch=st.integers(0, 10**9))
def test_a_micro_batch_always_travels_on_the_same_stripe(stripes: int, micro_batch: int) -> None:
    flow = topology.Flow("activations", A, B, stripes=stripes)
    stripe = topology.stripe_of(flow, micro_batch)
    assert stripe == topology.stripe_of(flow, micro_batch)
    assert stripe == topology.stripe_flows(flow)[micro_batch % stripes]


@pytest.mark.parametrize("stripes", [0, topology.MAX_STRIPES + 1])
def test_a_stripe_count_out_of_range_is_refused(stripes: int) -> None:
    with pytest.raises(ValueError, match="stripes must be in"):
        topology.stripe_flows(topology.Flow("activations", A, B, stripes=stripes))


def test_a_stripe_name_past_the_length_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="striped flow name"):
        topology.stripe_flows(topology.Flow("a" * 62, A, B, stripes=2))


def test_a_striped_plan_provisions_and_permits_every_stripe_and_nothing_else() -> None:
    plan = side_processes(Placement(head_cluster=A, tail_cluster=B, stripes=3), "split-head", "split-tail")
    names = [f.name for f in plan.flows]
    reply = topology.reply_flow("head-0")
    assert names == ["activations", "activations-s1", "activations-s2", reply, f"{reply}-s1", f"{reply}-s2"]
    head = plan.find("split-head").broker_identity("j")
    assert isinstance(head, WorkerIdentity)
    p = permissions("j", head, plan.flows)
    x = lambda f: topology.flow_exchange("j", f)  # noqa: E731
    q = lambda f: topology.queue_name("j", f)  # noqa: E731
    for j in ("", "-s1", "-s2"):
        assert re.fullmatch(p.write, x(f"activations{j}")) and re.fullmatch(p.read, q(f"{reply}{j}"))
        assert not re.fullmatch(p.write, x(f"{reply}{j}")) and not re.fullmatch(p.read, q(f"activations{j}"))
    assert not re.fullmatch(p.write, x("activations-s3"))


def test_the_stripes_setting_is_checked() -> None:
    from nebula_mq.errors import ConfigError
    from workers.split.job import load_split_job

    settings = Settings(job=JobSettings(id="j", scenario="split", steps=1, run_dir="/tmp/x"), split={"stripes": 0})
    with pytest.raises(ConfigError, match="stripes"):
        load_split_job(settings)
