"""A broker's federation links in one line each (``nebula_mq.transport.links``), from rows as the
management API and ``rabbitmqctl federation_status`` give them (taken from RabbitMQ 3.10)."""

from __future__ import annotations

from pathlib import Path

from nebula_mq.transport.links import LinkWatch, links_from

TLS_ALERT = ('{tls_alert,{handshake_failure,"TLS client: In state wait_cert at ssl_handshake.erl:2113 generated '
             'CLIENT ALERT: Fatal - Handshake Failure\\n {bad_cert,hostname_check_failed}"}}')


def _row(status: str, error: str = "", exchange: str = "nebula.j.status.x", vhost: str = "nebula-j") -> dict[str, str]:
    return {"upstream": "nebula-upstream-cluster-a", "vhost": vhost, "exchange": exchange, "status": status,
            "error": error, "uri": "amqps://a1.example.org:5671/nebula-j", "timestamp": "2026-12-07 17:16:29"}


def test_a_peers_links_show_as_their_worst_with_rabbitmqs_words_and_what_to_check() -> None:
    [link] = links_from("cluster-b", [_row("running"), _row("error", "econnrefused", exchange="nebula.j.acts")])
    assert (link.peer, link.target, link.up) == ("cluster-a", "a1.example.org:5671", False)
    line = link.line(now=0.0)
    assert line.startswith("link from cluster-a to cluster-b (a1.example.org:5671): down: econnrefused (nothing "
                           "listens there: check the peer's host and port"), line
    [tls] = links_from("cluster-b", [_row("error", TLS_ALERT)])
    assert "down: TLS: handshake_failure (hostname_check_failed) (the peer's broker certificate does not name " \
           "the host dialled" in tls.line(), tls.line()
    [up] = links_from("cluster-b", [_row("running")])
    assert up.line() == "link from cluster-a to cluster-b (a1.example.org:5671): up"
    assert links_from("cluster-b", [_row("running")], vhost="nebula-other") == []  # another job's


def test_how_long_a_link_has_been_down_is_remembered_across_commands_until_it_is_up(tmp_path: Path) -> None:
    down = links_from("cluster-b", [_row("error", "closed")])
    first = LinkWatch(tmp_path / "links.json").seen(down, now=1000.0)
    later = LinkWatch(tmp_path / "links.json").seen(down, now=1040.0)  # another command, same outage
    assert first[0].down_since == later[0].down_since == 1000.0
    assert "down for 40 s: closed (the connection was closed" in later[0].line(now=1040.0)
    LinkWatch(tmp_path / "links.json").seen(links_from("cluster-b", [_row("running")]), now=1050.0)
    again = LinkWatch(tmp_path / "links.json").seen(down, now=1060.0)
    assert again[0].down_since == 1060.0  # a new outage counts from its own start
