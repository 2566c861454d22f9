"""The brokers' max_message_size is one constant: the stack renders it into every node's
rabbitmq.conf, and job settings are bounded by it (tests/unit/runtime/test_oversized_send.py)."""

from __future__ import annotations

from pathlib import Path

from nebula_mq.security.certs import init_certs
from nebula_mq.settings import BROKER_MAX_MESSAGE_BYTES
from nebula_mq.stack import node
from nebula_mq.stack.layout import plan


def test_the_stack_renders_the_brokers_max_message_size_from_the_same_constant(tmp_path: Path) -> None:
    layout = plan(tmp_path / "st", ("cluster-a",), 6000, "t", "127.0.0.1", ("broker-a.example.org",))
    server = init_certs(layout.certs_dir, ["cluster-a"])["cluster-a"].ensure_server(["broker-a.example.org"])
    node.render(layout.nodes[0], server)
    lines = layout.nodes[0].config_file.read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("max_message_size")] == \
        [f"max_message_size = {BROKER_MAX_MESSAGE_BYTES}"]
