"""Scenario I flows and processes: which process publishes and consumes what, on which cluster.

Two layouts, chosen by ``[electra] generator_clusters``:

* one entry: one generator process ``gen`` hosts every generator; it publishes
  ``gen-results`` and consumes ``sync`` (``topology.electra_flows``);
* one entry per generator (M3, paper Figure 4: each generator on its own
  cluster, with its own task): generator ``k`` is the process ``gen-<k>`` on
  ``generator_clusters[k]``, publishing ``gen-results-<k>`` and consuming
  ``sync-<k>`` (``topology.electra_m3_flows``). The root consumes every
  ``gen-results-<k>`` (one inbox each, read as one :class:`OrderedInbox`) and sends
  each sync token to every ``sync-<k>``.

The plan's processes carry exactly these flows, so each identity's broker
permissions are exactly them (least privilege): a generator cannot read another
generator's tokens nor publish into its stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from nebula_mq import topology
from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings
from workers.electra.common import ElectraJob, disc_rank_id, generator_id
from workers.electra.job import load_job
from workers.processes import Plan, Process


def generator_slots(job: ElectraJob) -> tuple[int | None, ...]:
    """The flow suffix of each generator process: ``(None,)`` for the single process,
    ``(0, .., K-1)`` for a process per generator."""
    return tuple(range(len(job.generator_clusters))) if job.process_per_generator else (None,)


def results_flows(job: ElectraJob) -> tuple[str, ...]:
    """What the root consumes, one flow per generator process."""
    return tuple(topology.electra_results_flow(g) for g in generator_slots(job))


def sync_flows(job: ElectraJob) -> tuple[str, ...]:
    """Where the root sends each sync token, one flow per generator process."""
    return tuple(topology.electra_sync_flow(g) for g in generator_slots(job))


def flows(job: ElectraJob) -> tuple[topology.Flow, ...]:
    """The job's flows (see the module docstring)."""
    if not job.process_per_generator:
        return topology.electra_flows(job.cluster_of(0), job.disc_cluster, job.n)
    given = job.model.get("generators")
    # Presets have one generator; the model config checks the count again in every worker.
    k = len(given) if isinstance(given, Sequence) else 1
    if len(job.generator_clusters) != k:
        raise ConfigError("<electra>", "generator_clusters", f"1 or {k} entries (one per generator)",
                          list(job.generator_clusters))
    return topology.electra_m3_flows(job.generator_clusters, job.disc_cluster, job.n)


def flow_named(all_flows: Sequence[topology.Flow], name: str) -> topology.Flow:
    return next(f for f in all_flows if f.name == name)


def processes(settings: Settings) -> Plan:
    """The job's processes: root, subs 1..n-1, generator process(es)."""
    job = load_job(settings)
    subs = tuple(topology.sub_discriminator_flow(r) for r in range(1, job.n))
    # Each process may touch exactly its flows (least-privilege broker permissions).
    group = "discriminators" if job.n > 1 else ""  # one gloo group: restarted as a whole
    procs = [Process("electra-root", job.disc_cluster, disc_rank_id(0), 0,
                     publishes=(*sync_flows(job), *subs), consumes=results_flows(job), restart_group=group)]
    procs += [Process("electra-sub", job.disc_cluster, disc_rank_id(r), r,
                      consumes=(topology.sub_discriminator_flow(r),), restart_group=group)
              for r in range(1, job.n)]
    procs += [Process("electra-generator", job.cluster_of(g or 0), "gen" if g is None else generator_id(g),
                      g or 0, publishes=(topology.electra_results_flow(g),),
                      consumes=(topology.electra_sync_flow(g),))
              for g in generator_slots(job)]
    return Plan(tuple(procs), flows(job))
