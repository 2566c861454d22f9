"""Queue arguments of every queue we declare, in one place.

The same queue declared twice on a cluster must carry identical arguments
(RabbitMQ refuses a mismatch with 406 PRECONDITION_FAILED), so both sides of a
local flow and every restart call these functions, never build dicts by hand.

``x-queue-mode: lazy`` everywhere: a bounded queue may hold hundreds of MiB of
tensors while the WAN is down, and the federated downstream copy is fed by a
link that ignores memory alarms on 3.10 (docs/rabbitmq.md). Lazy classic queues
page message bodies to disk at once instead of holding them in RAM until a
memory alarm; our messages are persistent anyway, so the extra disk write is
one the broker does regardless, and it keeps the broker's RAM flat.
"""

from __future__ import annotations

from typing import Any

_CLASSIC = {"x-queue-type": "classic", "x-queue-mode": "lazy"}


def bounded_queue_arguments(max_queue_bytes: int) -> dict[str, Any]:
    """The sending side's copy: full => publish nacked => producer waits."""
    return {**_CLASSIC, "x-max-length-bytes": max_queue_bytes, "x-overflow": "reject-publish"}


def federated_copy_arguments() -> dict[str, Any]:
    """Both copies of a cross-cluster flow. The federation link may declare the
    upstream copy itself with the downstream copy's arguments (when the receiver
    starts first), so the two must be equal; the sending side's cap is applied
    by the job's cap policy (``topology.cap_policy``), set at provisioning."""
    return dict(_CLASSIC)


def dead_letter_arguments() -> dict[str, Any]:
    """Uncapped: a condemned message must never be refused."""
    return dict(_CLASSIC)
