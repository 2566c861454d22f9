"""Membership: which clusters take part in each sync event of a replicas job, agreed by all.

A replicas job (``workers/replicas``, docs/replicas.md) averages every cluster's
pseudo-gradient at each sync event. With ``[replicas] quorum`` below the number of clusters an
event may go on without a cluster that is away; the clusters it goes on with are the event's
**members**. Every cluster must apply every event with the same members, or the replicas'
weights part. This package decides them; the role above it sends and receives the messages.
It imports only ``errors`` and the runtime (``Received``, ``OrderedInbox``, ``CheckpointStore``,
``Collective``, logs): no role, no framework, no transport, so its tests run it alone
(tests/unit/membership).

The modules
-----------
``quorum``       ``Membership``, one cluster's side: whether an event's members are known yet,
                 who chooses them (the first cluster, or an election), how a cluster left out
                 of an event catches up. ``members_of`` and ``bits``: members on the wire, a bit
                 set (bit ``c`` for cluster ``c``), checked as they come in. ``QuorumJob``: what
                 it reads of the job (``workers.replicas.job.ReplicasJob`` is one).
``election``     ``Election``: Paxos over every event's members, for ``coordinator = "elected"``.
``durable_log``  append-only JSON lines, fsynced before anyone is told (``quorum.jsonl``,
                 ``election.jsonl``, beside the cluster's checkpoints).
``words``        lives and words: with ``[replicas] ranks`` only rank 0 takes part in all this;
                 it tells its other ranks whether the cluster trains each event, in words that
                 each name one life of the cluster's group.

How an event's members are decided
----------------------------------
1. A cluster sends its pseudo-gradient of event ``s``. Each time a message comes, the driver
   asks ``Membership.members(s, produced, heads)``: ``heads`` says which peers' parts are
   waiting. None means "not yet"; a tuple of clusters means the event is applied with them.
2. ``coordinator = "first"`` (the default). Cluster 0 **proposes** alone: every cluster once
   all have come, or, once ``quorum_wait_s`` has passed, those present if they are at least
   ``quorum`` (the **quorum**). It appends the choice to ``quorum.jsonl`` first, then the role
   publishes it (``{members: bits}`` on ``quorum-0-<d>``). The others check it (``admit``) and
   apply the event once the choice and every member's part have come.
3. ``coordinator = "elected"``. The **election** decides instead, so the job goes on while
   cluster 0 is away. ``Membership.elect`` polls it; the leader of the current epoch proposes
   (``accept``), each cluster that accepts tells the others (``accepted``), and an event is
   decided once a majority accepted the same members in the same epoch. A cluster that waited
   ``coordinator_wait_s`` without a decision starts a newer epoch, led by another cluster.
   Every promise, acceptance and decision is in ``election.jsonl`` before it is sent: the
   messages go out through ``send`` (the role's ``WanExchange.tell``) on ``elect-<c>-<d>``
   and come in through ``Membership.handle_other``, which knows each sender by its flow and
   dead-letters what is malformed.
4. A cluster left out of an event takes the event's outer weights (the role does that), then
   catches up: it applies the next events it is left out of from its queues without training,
   and trains again once no choice has come for a moment (``SETTLE_S``).

A restart reads the logs: the coordinator never chooses an event twice, and an election
member keeps what it promised and accepted. Checkpoints without ``election.jsonl`` refuse to
resume: the cluster would vote as if it had promised nothing.
"""
