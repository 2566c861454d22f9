"""A broker's federation links, as the broker reports them: up, or down with RabbitMQ's words.

Each cluster's broker dials its peers (one federation upstream per peer,
``topology.upstream_name``) for every flow that comes in, and the federation plugin retries a
link that fails every second, quietly: the only trace is a warning in RabbitMQ's own log. A
wrong port, a mistyped host, a peer whose CA was never imported all look alike from a worker
(no message comes). This module turns what the broker says of its links (the management API's
``/api/federation-links``, or ``rabbitmqctl federation_status``, the same fields) into one
line per peer: ``link from cluster-a (b1.example.test:5671): down for 40 s: econnrefused
(nothing listens there: check the peer's host and port, and that its broker is up)``.

The broker keeps no "since": :class:`LinkWatch` remembers when each link was first seen down
while it stays down, across reads (and across processes, given a file).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nebula_mq import topology

# Worst first: a peer's links (one per federated exchange or queue) are shown as their worst.
_RANK = {"error": 0, "shutdown": 1, "starting": 2, "running": 3}
# What RabbitMQ's words mean for the person reading them, and what to check.
_HINTS = (
    ("econnrefused", "nothing listens there: check the peer's host and port, and that its broker is up"),
    ("unknown_host", "the name does not resolve: check [clusters.<peer>.federation] host"),
    ("nxdomain", "the name does not resolve: check [clusters.<peer>.federation] host"),
    ("etimedout", "no answer: a firewall, a wrong address, or the WAN is down"),
    ("timeout", "no answer: a firewall, a wrong address, or the WAN is down"),
    ("ehostunreach", "no route to the peer's host"),
    ("hostname_check_failed", "the peer's broker certificate does not name the host dialled: use a name it "
                              "carries (`nebula-mq stack up --hostname`)"),
    ("unknown_ca", "a CA is missing: each side imports the other's (`nebula-mq certs import-ca`)"),
    ("certificate_required", "the peer refused the link's certificate: it does not trust this cluster's CA yet "
                             "(`nebula-mq certs import-ca` on the peer)"),
    ("certificate_revoked", "a certificate is revoked by its CA's CRL"),
    ("certificate_expired", "a certificate has expired"),
    ("bad_certificate", "the peer refused the link's certificate (its CA, or a CRL it cannot find)"),
    ("access_refused", "the peer's broker refused the link's user: is the job provisioned there?"),
    ("not_allowed", "the job's vhost does not exist on the peer yet: provision it there"),
    ("closed", "the connection was closed (the WAN cut, or the peer's broker restarting)"),
)


@dataclass(frozen=True)
class FederationLink:
    """The links of one broker (``cluster``) from one peer, in one vhost: the worst of them."""

    cluster: str
    peer: str
    vhost: str
    target: str  # host:port the link dials
    status: str  # running, starting, error or shutdown
    error: str = ""  # RabbitMQ's words for the last failure ("" while running)
    down_since: float | None = None  # first seen not running, while it stays so

    @property
    def up(self) -> bool:
        return self.status == "running"

    def line(self, now: float | None = None) -> str:
        """``link from cluster-a to cluster-b (127.0.0.1:5671): up``, or down for how long and why."""
        head = f"link from {self.peer} to {self.cluster} ({self.target})"
        if self.up:
            return f"{head}: up"
        since = "" if self.down_since is None else f" for {_duration((now or time.time()) - self.down_since)}"
        words = self.error or self.status
        hint = hint_for(self.error)
        return f"{head}: {'starting' if self.status == 'starting' and not self.error else 'down'}{since}: {words}" + (
            f" ({hint})" if hint else "")


def hint_for(error: str) -> str:
    """What RabbitMQ's ``error`` means and what to check ('' when it is not one we know)."""
    low = error.lower()
    return next((hint for word, hint in _HINTS if word in low), "")


def readable_error(raw: Any) -> str:
    """RabbitMQ's error term, kept in its words but on one line: a TLS alert keeps its alert and
    reason (``tls_alert certificate_required``), anything else its text."""
    text = " ".join(str(raw or "").split())
    alert = re.search(r"tls_alert,\{(\w+)", text)
    if alert:
        reason = re.search(r"\{bad_cert,(\w+)\}", text)
        return f"TLS: {alert.group(1)}" + (f" ({reason.group(1)})" if reason else "")
    return text


def links_from(cluster: str, rows: Iterable[Mapping[str, Any]], vhost: str = "") -> list[FederationLink]:
    """One :class:`FederationLink` per (vhost, peer) of ``cluster``'s broker from the rows its
    management API or ``rabbitmqctl federation_status`` gives; only ``vhost``'s when given."""
    worst: dict[tuple[str, str], FederationLink] = {}
    for row in rows:
        if vhost and row.get("vhost") != vhost:
            continue
        upstream = str(row.get("upstream", ""))
        parts = urlsplit(str(row.get("uri", "")))
        link = FederationLink(cluster, topology.upstream_cluster(upstream), str(row.get("vhost", "")),
                              f"{parts.hostname}:{parts.port}" if parts.hostname else "?",
                              str(row.get("status", "?")), readable_error(row.get("error")))
        key = (link.vhost, link.peer)
        if key not in worst or _RANK.get(link.status, 0) < _RANK.get(worst[key].status, 0):
            worst[key] = link
    return [worst[k] for k in sorted(worst)]


class LinkWatch:
    """When each link was first seen down while it stayed down, across reads; kept in ``path``
    (a JSON file) when given, so one command run after another still says "for 40 s"."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.since: dict[str, float] = {}
        if path is not None:
            try:
                self.since = {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
            except (OSError, ValueError, AttributeError):
                self.since = {}

    def seen(self, links: Iterable[FederationLink], now: float | None = None) -> list[FederationLink]:
        """``links`` with their ``down_since``; remembers it for the next read."""
        now = time.time() if now is None else now
        out = []
        for link in links:
            key = f"{link.cluster}|{link.vhost}|{link.peer}"
            if link.up:
                self.since.pop(key, None)
                out.append(link)
            else:
                out.append(replace(link, down_since=self.since.setdefault(key, now)))
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps(self.since, sort_keys=True))
            except OSError:
                pass  # a read-only stack directory (a rank host): since this process began, then
        return out


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h {s % 3600 // 60} min"
