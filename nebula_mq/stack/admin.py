"""Administering one broker: how a job's definitions get there and how they leave.

One ABC, two ways in:

* :class:`HttpAdmin`: the management API over HTTPS as an administrator, for any broker
  reachable over the network (``nebula-mq provision``) and for the local stack's nodes
  (:func:`local_admin`);
* :class:`CtlAdmin`: ``rabbitmqctl`` on a node of the local stack (Erlang cookie, this host),
  for a node rendered before its administrator's password was kept beside it. Each call
  starts an Erlang VM, about 0.6 s of CPU: a request to the API costs a TLS handshake.

Both apply the same definitions document (``provision.definitions``), so ``nebula-mq run``
on the local stack and ``nebula-mq provision`` on a remote broker create the same objects.
"""

from __future__ import annotations

import abc
import functools
import json
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from nebula_mq import topology
from nebula_mq.errors import StackError, TransportError
from nebula_mq.security.certs import ClusterCA
from nebula_mq.settings import BrokerSettings
from nebula_mq.stack import node as nodes
from nebula_mq.stack.layout import NodeLayout
from nebula_mq.transport.management import ManagementClient

# Importing definitions on a busy broker takes a few seconds.
IMPORT_TIMEOUT_S = 60.0
# An administrator's one-shot command rides out a busy broker's passing 5xx answers.
ADMIN_ATTEMPTS = 4


class BrokerAdmin(abc.ABC):
    """What provisioning needs from a broker, as its administrator."""

    # Where this broker is, for messages.
    name: str = ""

    @abc.abstractmethod
    def import_definitions(self, defs: Mapping[str, Any]) -> None:
        """Create or update every object of ``defs`` (additive: nothing else is touched)."""

    @abc.abstractmethod
    def delete_vhost(self, vhost: str) -> bool:
        """Delete ``vhost`` and everything in it; False when it did not exist."""

    @abc.abstractmethod
    def users_of(self) -> dict[str, list[str]]:
        """Every user, and the vhosts it holds permissions on (maybe none)."""

    @abc.abstractmethod
    def delete_user(self, user: str) -> None: ...

    @abc.abstractmethod
    def federation_links(self) -> list[dict[str, Any]]:
        """The broker's federation links, every vhost: each one's upstream, vhost, uri, status
        and error, as the federation plugin reports them (``transport.links``)."""


class CtlAdmin(BrokerAdmin):
    """A node of the local stack, through ``rabbitmqctl -n NODE``."""

    def __init__(self, node: NodeLayout) -> None:
        self.name = node.node
        self.ctl = functools.partial(nodes.rabbitmqctl, node)
        self.work_dir = node.path

    def import_definitions(self, defs: Mapping[str, Any]) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.work_dir, prefix="definitions-", suffix=".json") as fh:
            json.dump(defs, fh, indent=1)
            fh.flush()
            self.ctl("import_definitions", fh.name, timeout=IMPORT_TIMEOUT_S)

    def delete_vhost(self, vhost: str) -> bool:
        if vhost not in self.ctl("list_vhosts", "--quiet", "--no-table-headers").split():
            return False
        self.ctl("delete_vhost", vhost)
        return True

    def federation_links(self) -> list[dict[str, Any]]:
        return list(json.loads(self.ctl("federation_status", "--formatter", "json", "--quiet") or "[]"))

    def users_of(self) -> dict[str, list[str]]:
        users = json.loads(self.ctl("list_users", "--formatter", "json", "--quiet") or "[]")
        out: dict[str, list[str]] = {str(u["user"]): [] for u in users}
        vhosts = self.ctl("list_vhosts", "--quiet", "--no-table-headers").split()
        for vhost in vhosts:
            rows = json.loads(self.ctl("list_permissions", "-p", vhost, "--formatter", "json", "--quiet") or "[]")
            for row in rows:
                out.setdefault(str(row["user"]), []).append(vhost)
        return out

    def delete_user(self, user: str) -> None:
        self.ctl("delete_user", user)


class HttpAdmin(BrokerAdmin):
    """Any broker, through its management API, as a user tagged ``administrator``.

    ``broker`` says how to reach it: ``host`` and ``server_name``, the TLS files
    (``ca_file``, ``cert_file``, ``key_file``), ``management_port``,
    ``management_user`` and ``management_password_file``.
    """

    def __init__(self, broker: BrokerSettings) -> None:
        self.name = f"https://{broker.server_name}:{broker.management_port}"
        try:
            self.client = ManagementClient(broker)
        except TransportError as exc:
            raise StackError(f"{self.name}: {exc}") from None

    def _call(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        try:
            return self.client.request(method, path, body, timeout=timeout, attempts=ADMIN_ATTEMPTS)
        except TransportError as exc:
            hint = (" (the admin user needs the administrator tag)" if " 401 " in str(exc) or " 403 " in str(exc)
                    else "")
            raise StackError(f"{self.name}: {exc}{hint}") from None

    def import_definitions(self, defs: Mapping[str, Any]) -> None:
        self._call("POST", "definitions", dict(defs), timeout=IMPORT_TIMEOUT_S)

    def delete_vhost(self, vhost: str) -> bool:
        # Without statistics: existence is all this needs, and it spares a busy broker's stats DB.
        if self._call("GET", f"vhosts/{quote(vhost, safe='')}?disable_stats=true") is None:
            return False
        self._call("DELETE", f"vhosts/{quote(vhost, safe='')}", timeout=IMPORT_TIMEOUT_S)
        return True

    def users_of(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {str(u["name"]): [] for u in self._call("GET", "users") or []}
        for row in self._call("GET", "permissions") or []:
            out.setdefault(str(row["user"]), []).append(str(row["vhost"]))
        return out

    def delete_user(self, user: str) -> None:
        self._call("DELETE", f"users/{quote(user, safe='')}")

    def federation_links(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "federation-links") or [])


# The client certificate the stack's administrator presents to a node's management API.
STACK_ADMIN_CLIENT = "nebula-stack-admin"


def local_admin(node: NodeLayout, ca: ClusterCA, management_listen: str) -> BrokerAdmin:
    """A local stack's node as its administrator: its management API as the node's default
    user, or ``rabbitmqctl`` where the node has no API port or no kept password (a stack
    rendered by an older version)."""
    password = nodes.admin_password_file(node)
    if not node.mgmt_port or not password.is_file():
        return CtlAdmin(node)
    client = ca.ensure_client(STACK_ADMIN_CLIENT)
    host = "127.0.0.1" if management_listen in ("0.0.0.0", "::") else management_listen
    return HttpAdmin(BrokerSettings(
        host=host, port=node.tls_port, tls=True, ca_file=str(client.ca_file), cert_file=str(client.cert_file),
        key_file=str(client.key_file), server_name="localhost", management_port=node.mgmt_port,
        management_user=nodes.STACK_ADMIN, management_password_file=str(password)))


def deprovision(admin: BrokerAdmin, job_id: str, workers: Sequence[str]) -> list[str]:
    """Remove job ``job_id`` from ``admin``'s broker, and nothing else: its vhost (queues,
    exchanges, policies, upstreams and permissions go with it), its monitoring, status-reader and
    key-courier users, and those of ``workers`` (the job's own certificate users) that hold no
    permission on another vhost.
    The peer brokers' federation users serve every job: they stay. Returns what was removed."""
    vhost = topology.vhost(job_id)
    before = admin.users_of()
    removed = [f"vhost {vhost}"] if admin.delete_vhost(vhost) else []
    job_users = (topology.monitoring_user(job_id), topology.status_reader(job_id), topology.key_courier(job_id))
    for user in (*workers, *job_users):
        elsewhere = [v for v in before.get(user, []) if v != vhost]
        if user in before and not elsewhere:
            admin.delete_user(user)
            removed.append(f"user {user}")
    return removed
