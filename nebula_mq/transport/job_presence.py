"""Whether a broker still holds a job: an outage is waited out, a lost job is not.

A broker restarted with its data wiped (its mnesia directory and message store deleted while
it was stopped, a node re-installed, a disk replaced) comes back without the job's vhost, its
certificate users, its queues and the messages in them. A worker's reconnects to it then fail
at login: the broker refuses the certificate's user (``Login was refused``) or the vhost
(``vhost ... not found``, ``access to vhost refused``). An outage fails differently: the
connection is refused, times out or breaks in TLS, and the I/O threads retry until it ends.

:func:`job_gone` opens one connection of its own and tells the two apart; a certificate
revoked meanwhile fails in the TLS handshake (``security.revocation``), so it is not taken for
a lost job. Callers confirm a loss with a second look a little later (``runtime.lost_broker``).

A broker wiped and provisioned again (``nebula-mq run`` provisions) admits the login, but holds
none of what the job had put there. Provisioning therefore marks each broker's copy of the job
with an *incarnation*: an internal exchange ``nebula.<job>.incarnation.<token>`` with a fresh
token each time (:func:`incarnation_exchange`; import is additive, so an intact broker keeps its
older markers too). A worker notes the oldest marker it finds beside its checkpoints and, on a
later start, looks for that one (:func:`incarnations`, through the management API as the job's
monitoring user): a broker that no longer has it is not the broker its checkpoints were made
with.
"""

from __future__ import annotations

import secrets
import time
from urllib.parse import quote

from nebula_mq import topology
from nebula_mq.errors import AccessRefused, TransportError
from nebula_mq.settings import BrokerSettings

from . import base
from .connection import close_quietly, open_connection
from .management import ManagementClient


def incarnation_exchange(job_id: str, token: str) -> str:
    """The marker exchange of one provisioning of ``job_id`` on a broker."""
    return f"{topology.PREFIX}.{job_id}.incarnation.{token}"


def new_incarnation() -> str:
    """A fresh token: when (UTC, so the oldest sorts first) and 6 random hex digits."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def incarnations(broker: BrokerSettings, job_id: str) -> list[str] | None:
    """The tokens of the job's markers on ``broker``, oldest first ([] when its vhost is gone);
    None when the broker cannot say (no management API in the settings, or it does not answer)."""
    if not broker.management_port:
        return None
    prefix = incarnation_exchange(job_id, "")
    try:
        rows = ManagementClient(broker).get(f"exchanges/{quote(broker.vhost, safe='')}?columns=name")
    except TransportError:
        return None
    if rows is None:
        return []
    if not isinstance(rows, list):
        return None
    names = [str(r.get("name", "")) for r in rows if isinstance(r, dict)]
    return sorted(n[len(prefix):] for n in names if n.startswith(prefix))


def job_gone(broker: BrokerSettings, name: str = "nebula-mq/presence") -> str | None:
    """Why ``broker`` no longer holds the job of ``broker.vhost`` (its login refused), or None
    when it does or cannot be reached now (an outage: wait)."""
    try:
        conn = open_connection(broker, name)
    except AccessRefused:  # the refusal's own text advises provisioning: the caller says more
        return f"vhost {broker.vhost} is gone: the broker refuses this worker's login on it"
    except TransportError:
        return None
    close_quietly(conn)
    return None


def _broker(transport: base.Transport) -> BrokerSettings | None:
    """A RabbitMQ transport's broker; None for any other transport (the in-memory one of the
    unit tests loses nothing)."""
    from .rabbit import RabbitTransport

    return transport.broker if isinstance(transport, RabbitTransport) else None


def transport_job_gone(transport: base.Transport) -> str | None:
    """:func:`job_gone` for a RabbitMQ transport's broker; None for any other transport."""
    broker = _broker(transport)
    return None if broker is None else job_gone(broker, f"{transport.job_id}/{transport.cluster}/presence")


def transport_incarnations(transport: base.Transport) -> list[str] | None:
    """:func:`incarnations` of a RabbitMQ transport's broker; None for any other transport."""
    broker = _broker(transport)
    return None if broker is None else incarnations(broker, transport.job_id)
