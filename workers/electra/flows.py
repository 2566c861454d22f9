"""Scenario I flows and processes: which process publishes and consumes what, on which cluster.

Two layouts, chosen by ``[electra] generator_clusters``:

* one entry: one generator process ``gen`` hosts every generator; it publishes
  ``gen-results`` and consumes ``sync`` (``electra_flows``);
* one entry per generator (M3, paper Figure 4: each generator on its own
  cluster, with its own task): generator ``k`` is the process ``gen-<k>`` on
  ``generator_clusters[k]``, publishing ``gen-results-<k>`` and consuming
  ``sync-<k>`` (``electra_m3_flows``). The root consumes every
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
from nebula_mq.topology import Flow, FlowKind
from workers.electra.common import GENERATOR_ROLE, ROOT_ROLE, SUB_ROLE, ElectraJob, disc_rank_id, generator_id
from workers.electra.job import load_job
from workers.processes import Plan, Process


def sub_discriminator_flow(index: int) -> str:
    """Root discriminator to sub-discriminator ``index``: its share of each micro-batch."""
    return f"sub-disc-{index}"


def electra_results_flow(generator: int | None = None) -> str:
    """Generator micro-batches to the root discriminator: one flow for a process hosting
    every generator (``None``), or generator ``k``'s own flow (M3 on separate clusters)."""
    return "gen-results" if generator is None else f"gen-results-{generator}"


def electra_sync_flow(generator: int | None = None) -> str:
    """Sync tokens from the root discriminator back to the generator process(es)."""
    return "sync" if generator is None else f"sync-{generator}"


def electra_flows(gen_cluster: str, disc_cluster: str, n_sub: int) -> tuple[Flow, ...]:
    """Scenario I: generator -> root discriminator -> n sub-discriminators; sync back."""
    out = [
        Flow(electra_results_flow(), gen_cluster, disc_cluster),
        Flow(electra_sync_flow(), disc_cluster, gen_cluster, FlowKind.SYNC),
    ]
    out += [Flow(sub_discriminator_flow(i), disc_cluster, disc_cluster) for i in range(n_sub)]
    return tuple(out)


def electra_m3_flows(gen_clusters: tuple[str, ...], disc_cluster: str, n_sub: int) -> tuple[Flow, ...]:
    """Scenario I with M3 generators on their own clusters: generator ``k`` (on
    ``gen_clusters[k]``) publishes on ``gen-results-<k>`` and gets its own ``sync-<k>``
    tokens back, so each generator process consumes only its own sync stream."""
    if not gen_clusters:
        raise ValueError("at least one generator cluster")
    out = [Flow(electra_results_flow(k), c, disc_cluster) for k, c in enumerate(gen_clusters)]
    out += [Flow(electra_sync_flow(k), disc_cluster, c, FlowKind.SYNC) for k, c in enumerate(gen_clusters)]
    out += [Flow(sub_discriminator_flow(i), disc_cluster, disc_cluster) for i in range(n_sub)]
    return tuple(out)


def generator_slots(job: ElectraJob) -> tuple[int | None, ...]:
    """The flow suffix of each generator process: ``(None,)`` for the single process,
    ``(0, .., K-1)`` for a process per generator."""
    return tuple(range(len(job.generator_clusters))) if job.process_per_generator else (None,)


def results_flows(job: ElectraJob) -> tuple[str, ...]:
    """What the root consumes, one flow per generator process."""
    return tuple(electra_results_flow(g) for g in generator_slots(job))


def sync_flows(job: ElectraJob) -> tuple[str, ...]:
    """Where the root sends each sync token, one flow per generator process."""
    return tuple(electra_sync_flow(g) for g in generator_slots(job))


def flows(job: ElectraJob) -> tuple[topology.Flow, ...]:
    """The job's flows (see the module docstring)."""
    if not job.process_per_generator:
        return electra_flows(job.cluster_of(0), job.disc_cluster, job.n)
    given = job.model.get("generators")
    # Presets have one generator; the model config checks the count again in every worker.
    k = len(given) if isinstance(given, Sequence) else 1
    if len(job.generator_clusters) != k:
        raise ConfigError("<electra>", "generator_clusters", f"1 or {k} entries (one per generator)",
                          list(job.generator_clusters))
    return electra_m3_flows(job.generator_clusters, job.disc_cluster, job.n)


def flow_named(all_flows: Sequence[topology.Flow], name: str) -> topology.Flow:
    return next(f for f in all_flows if f.name == name)


def processes(settings: Settings) -> Plan:
    """The job's processes: root, subs 1..n-1, generator process(es)."""
    job = load_job(settings)
    subs = tuple(sub_discriminator_flow(r) for r in range(1, job.n))
    # Each process may touch exactly its flows (least-privilege broker permissions).
    group = "discriminators" if job.n > 1 else ""  # one gloo group: restarted as a whole
    hosts = job.disc_hosts or ("",) * job.n
    procs = [Process(ROOT_ROLE, job.disc_cluster, disc_rank_id(0), 0,
                     publishes=(*sync_flows(job), *subs), consumes=results_flows(job), restart_group=group,
                     host=hosts[0])]
    procs += [Process(SUB_ROLE, job.disc_cluster, disc_rank_id(r), r,
                      consumes=(sub_discriminator_flow(r),), restart_group=group, host=hosts[r])
              for r in range(1, job.n)]
    procs += [Process(GENERATOR_ROLE, job.cluster_of(g or 0), "gen" if g is None else generator_id(g),
                      g or 0, publishes=(electra_results_flow(g),),
                      consumes=(electra_sync_flow(g),))
              for g in generator_slots(job)]
    return Plan(tuple(procs), flows(job))
