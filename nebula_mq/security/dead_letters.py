"""Which messages in a dead-letter queue no condemning consumer vouches for.

A consumer condemns a message through the transport, which stamps the dead letter with its
connection's user name as the AMQP ``user_id`` (the broker refuses a ``user_id`` that is not the
publishing connection's user) and then audits it (``message_dead_lettered``). Only the roles
that consume may publish into the dead-letter exchange (``roles.permissions``), but such a
role's certificate could still publish an arbitrary message there by hand. :func:`check` finds
each dead letter that

* has no ``user_id`` (not published by the transport's ``dead_letter``),
* names a user that is not one of the cluster's consuming roles (``roles.dead_letter_writers``),
* or, given the job's audit log, has no ``message_dead_lettered`` record under its message id.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol


class Letter(Protocol):
    """What the check reads of a dead letter (``transport.dead_letters.DeadLetter``)."""

    @property
    def message_id(self) -> str: ...
    @property
    def user_id(self) -> str | None: ...
    @property
    def reason(self) -> str: ...


@dataclass(frozen=True)
class Finding:
    cluster: str
    message_id: str
    user_id: str | None
    reason: str
    problem: str

    def line(self) -> str:
        """One line of ``nebula-mq audit dead-letters``."""
        return (f"UNVOUCHED {self.cluster} dead letter {self.message_id or '(no message id)'!s}: {self.problem} "
                f"(user_id {self.user_id or '-'}, reason {self.reason or '-'})")


def check(cluster: str, letters: Iterable[Letter], consumers: Collection[str],
          audited: Collection[str] | None = None) -> list[Finding]:
    """A :class:`Finding` per dead letter in ``letters`` that ``consumers`` (the identities that
    may condemn on ``cluster``) do not vouch for; ``audited``: the message ids of the audit
    log's ``message_dead_lettered`` records (None: the log is not checked)."""
    out = []
    for letter in letters:
        if not letter.user_id:
            problem = "no user_id: not condemned by a consumer's transport (published by hand?)"
        elif letter.user_id not in consumers:
            problem = f"user_id {letter.user_id!r} is not a consuming role of this job on {cluster}"
        elif audited is not None and letter.message_id not in audited:
            problem = "no message_dead_lettered record in the audit log"
        else:
            continue
        out.append(Finding(cluster, letter.message_id, letter.user_id, letter.reason, problem))
    return out
