"""The ``rotate`` fault: certificates replaced while the job runs.

Worker ``target``'s client certificate and its cluster's broker certificate get new keys and
certificates (``nebula-mq certs rotate``: the old serials are revoked), recorded in the job's
audit log. Then the broker closes every connection of the job's vhost, so each connection of
the worker handshakes again with its new files (the transport reads them at every handshake)
and the peers' federation links into that broker verify its new certificate (the broker reads
it at every handshake). Nothing is lost: what was unacked on a closed connection is delivered
again, and what was unconfirmed is published again.
"""

from __future__ import annotations

from nebula_mq import topology
from nebula_mq.errors import ConfigError
from nebula_mq.launch import JobProcesses
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.lifecycle import rotate


def rotate_certificates(job: JobProcesses, worker_id: str) -> str:
    """Rotate ``worker_id``'s certificate and its broker's, then make every connection of the
    job on that broker handshake again; returns what was done, for the injector's log."""
    procs = {p.worker_id: p for p in job.plan.processes}
    if worker_id not in procs:
        raise ConfigError("<chaos>", "rotate target", f"a worker of the job, one of {sorted(procs)}", worker_id)
    proc = procs[worker_id]
    certs = job.stack.layout.certs_dir
    audit = AuditLog(job.run_dir / "audit" / "audit.jsonl")
    client = rotate(certs, proc.cluster, proc.identity(job.settings.job.id), audit)
    rotate(certs, proc.cluster, "server", audit)
    job.stack.rabbitmqctl(proc.cluster, "close_all_connections", "--vhost", topology.vhost(job.settings.job.id),
                          "certificates rotated")
    return f"{proc.cluster}: rotated {client.cn} and the broker's certificate, closed the job's connections"
