"""A node's rendered configuration: where it listens (loopback always, another host's address on
request), the management API on loopback unless told otherwise, and the names its certificate carries."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from nebula_mq.errors import StackError
from nebula_mq.security.certs import init_certs
from nebula_mq.stack import node
from nebula_mq.stack.layout import StackLayout, plan


def _render(tmp_path: Path, listen: str) -> str:
    layout = plan(tmp_path / "st", ("cluster-a",), 6000, "t", listen, ("broker-a.example.org",))
    cas = init_certs(layout.certs_dir, ["cluster-a"])
    n = layout.nodes[0]
    node.render(n, cas["cluster-a"].ensure_server(["broker-a.example.org", listen]), listen)
    return n.config_file.read_text() + n.advanced_config_file.read_text()


def test_a_node_listens_on_loopback_and_on_the_address_other_hosts_reach(tmp_path: Path) -> None:
    text = _render(tmp_path, "10.9.8.7")
    assert "listeners.ssl.1 = 127.0.0.1:6000" in text and "listeners.ssl.2 = 10.9.8.7:6000" in text
    assert "listeners.tcp = none" in text
    # The management API stays on loopback, HTTPS only, whatever --listen says.
    assert '{ip, "127.0.0.1"}' in text and "{port, 6030}" in text and "management.tcp" not in text
    cert = x509.load_pem_x509_certificate((tmp_path / "st" / "certs" / "cluster-a" / "server" / "cert.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "broker-a.example.org" in sans.get_values_for_type(x509.DNSName)
    assert {str(i) for i in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.9.8.7"}


def test_a_loopback_stack_has_one_listener_and_the_layout_round_trips(tmp_path: Path) -> None:
    text = _render(tmp_path, "127.0.0.1")
    assert "listeners.ssl.1 = 127.0.0.1:6000" in text and "listeners.ssl.2" not in text
    layout = plan(tmp_path / "st", ("cluster-a", "cluster-b"), 6000, "t", "10.0.0.1", ("a.example.org",))
    layout.save()
    assert StackLayout.load(tmp_path / "st") == layout
    assert [n.mgmt_port for n in layout.nodes] == [6030, 6031]


@pytest.mark.parametrize("listen, hostnames", [("broker-a", ()), ("10.0.0.1", ("bad name",)), ("10.0.0.1", ("-x.org",))])
def test_a_bad_address_or_hostname_is_refused(tmp_path: Path, listen: str, hostnames: tuple[str, ...]) -> None:
    with pytest.raises(StackError):
        plan(tmp_path, ("cluster-a",), 6000, "t", listen, hostnames)


def test_a_compose_node_listens_everywhere_and_serves_management_to_its_network(tmp_path: Path) -> None:
    """What docker-compose.yml's broker runs (`stack up --foreground --listen 0.0.0.0
    --management-listen 0.0.0.0`): every address, no unspecified address in the certificate, and
    workers reach it by a name the certificate carries (another name is refused before connecting)."""
    from nebula_mq.stack import Stack

    stack = Stack(tmp_path / "st", ("cluster-a",), 5671, "t", "0.0.0.0", ("broker-a.nebula.test",), "0.0.0.0")
    stack._prepare()
    n = stack.layout.nodes[0]
    text = n.config_file.read_text() + n.advanced_config_file.read_text()
    assert "listeners.ssl.1 = 5671" in text and "listeners.ssl.2" not in text
    assert '{ip, "0.0.0.0"}' in text and "{port, 5701}" in text
    assert StackLayout.load(tmp_path / "st") == stack.layout
    cert = x509.load_pem_x509_certificate((tmp_path / "st" / "certs" / "cluster-a" / "server" / "cert.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(i) for i in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    b = Stack.open(tmp_path / "st").broker_settings("cluster-a", "job.enc-0", host="broker-a.nebula.test")
    assert (b.host, b.server_name, b.port) == ("broker-a.nebula.test", "broker-a.nebula.test", 5671)
    with pytest.raises(StackError, match="--hostname broker-b"):
        stack.broker_settings("cluster-a", "job.enc-0", host="broker-b")
    with pytest.raises(StackError, match="one cluster"):
        Stack(tmp_path / "two", ("cluster-a", "cluster-b"), 5671, "t").serve()


def test_a_tools_stack_takes_free_ports_below_the_ephemeral_range() -> None:
    """Stacks that benchmarks, studies and tests start keep every port (TLS, relay, management,
    Erlang distribution) below 32768, where no outgoing connection can take one while a node
    is down, and skip a base whose ports are busy."""
    import os
    import socket

    from nebula_mq.stack.layout import EPHEMERAL_START, TOOL_BASE_PORTS, free_base_port, stack_ports

    assert stack_ports(6000, 2) == [6000, 6001, 6010, 6011, 6030, 6031, 26000, 26001]
    assert max(stack_ports(TOOL_BASE_PORTS[-1], 10)) < EPHEMERAL_START
    base = free_base_port(2, os.getpid())
    assert base in TOOL_BASE_PORTS
    with socket.socket() as holder:  # its dist port busy: the same seed must move elsewhere
        # Listening with SO_REUSEADDR, as a node does: the probe finds the port taken, and a
        # TIME_WAIT leftover there (which the probe counts as free) does not stop this bind.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", stack_ports(base, 2)[-1]))
        holder.listen()
        other = free_base_port(2, os.getpid())
    assert other != base and other in TOOL_BASE_PORTS


def test_a_gloo_group_takes_free_ports_between_the_tools_stacks_and_their_dist_ports() -> None:
    """A group's store and ranks (base .. base + n) come from above the tools' stacks and below
    their dist ports, all free; a base one of whose ports is taken is passed over."""
    import os
    import socket

    from nebula_mq.stack.layout import GROUP_BASE_PORTS, TOOL_BASE_PORTS, free_group_port, stack_ports

    base = free_group_port(4)
    assert base in GROUP_BASE_PORTS and base == free_group_port(4, os.getpid())
    nodes, dist = stack_ports(TOOL_BASE_PORTS[-1], 3)[:9], stack_ports(TOOL_BASE_PORTS[0], 3)[9:]
    assert max(nodes) < base and base + 4 < min(dist)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 2))
        holder.listen()
        other = free_group_port(4)
    assert other != base and base + 2 not in range(other, other + 5)


def test_port_free_sees_a_listener_and_with_reuse_addr_off_a_closed_connection():
    """``port_free`` is the one probe of the stacks, the benchmarks' gloo groups and the test
    fixtures: a listening port is taken either way; one that a closed connection leaves in
    TIME_WAIT is free for a node (``reuse_addr``) and taken for the stricter probe."""
    import socket
    import time

    from nebula_mq.stack.layout import port_free

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a node's listener does
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not port_free(port) and not port_free(port, reuse_addr=False)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
        client.close()
    time.sleep(0.05)
    assert port_free(port)
    assert not port_free(port, reuse_addr=False)


def test_a_stopped_stack_comes_back_on_its_own_ports_unless_told_otherwise(tmp_path: Path) -> None:
    """`run`, `up` and `provision --stack` open a stopped stack by its directory alone: the layout
    it was started with (`stack up --base-port 5671 --prefix t --listen ...`) stands, not the
    defaults; what a caller gives explicitly wins."""
    from nebula_mq.cli import build_parser
    from nebula_mq.stack import DEFAULT_BASE_PORT, Stack

    started = Stack(tmp_path / "st", ("cluster-a",), 5671, "t", "0.0.0.0", ("broker-a.nebula.test",), "0.0.0.0")
    started._prepare()  # saved, nothing running
    assert Stack(tmp_path / "st").layout == started.layout  # clusters, ports, addresses, names: all kept
    up = build_parser().parse_args(["stack", "up"])  # `stack up` alone gives none of them: the saved ones stand
    assert all(getattr(up, k) is None for k in ("clusters", "base_port", "prefix", "listen", "hostname",
                                                "management_listen"))
    assert Stack(tmp_path / "st", ("cluster-a",), base_port=5771).layout.base_port == 5771
    assert Stack(tmp_path / "fresh", ("cluster-a",)).layout.base_port == DEFAULT_BASE_PORT
