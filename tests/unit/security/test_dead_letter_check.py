"""Which dead letters no consuming role vouches for (``security.dead_letters.check``), and who may
condemn on a cluster (``roles.dead_letter_writers``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nebula_mq import topology
from nebula_mq.security.dead_letters import check
from nebula_mq.security.roles import WorkerIdentity, dead_letter_auditor_permissions, dead_letter_writers

FLOWS = topology.abnet_flows("cluster-a", "cluster-b", ("enc-0",))


@dataclass(frozen=True)
class Letter:
    message_id: str
    user_id: str | None
    reason: str = "malformed"


def test_only_consuming_roles_may_write_dead_letters() -> None:
    dec = WorkerIdentity("j.dec-0", publishes=(topology.reply_flow("enc-0"),), consumes=("activations",))
    pub = WorkerIdentity("j.pub-0", publishes=("activations",))
    assert dead_letter_writers("j", [dec, pub], FLOWS) == {"j.dec-0"}
    perms = dead_letter_auditor_permissions("j")
    assert re.fullmatch(perms.read, topology.dead_letter_queue("j"))
    assert not re.fullmatch(perms.read, topology.queue_name("j", "activations"))
    assert perms.write == perms.configure == "^$"


def test_each_unvouched_dead_letter_is_one_finding() -> None:
    letters = [Letter("ok", "j.dec-0"), Letter("bare", None), Letter("other", "j.pub-0"), Letter("unaudited", "j.dec-0")]
    findings = check("cluster-b", letters, {"j.dec-0"}, audited={"ok"})
    assert [(f.message_id, f.problem.split(":")[0]) for f in findings] == [
        ("bare", "no user_id"), ("other", "user_id 'j.pub-0' is not a consuming role of this job on cluster-b"),
        ("unaudited", "no message_dead_lettered record in the audit log")]
    assert findings[0].line().startswith("UNVOUCHED cluster-b dead letter bare: no user_id")
    assert check("cluster-b", letters[:1] + letters[3:], {"j.dec-0"}) == []
