"""What the Scenario I roles share: the ``[electra]`` job section, model config, ids, n_sub.

Role and process layout (paper §3.3, Figures 4 and 6):

* ``electra-generator``: each step a generator makes ``n_sub`` micro-batches
  (mask, MLM forward/backward, sample replacements), publishes each (ids and
  0/1 masks, lz4; no embeddings), then applies its optimiser step. With one
  ``generator_clusters`` entry, one process (``gen``) hosts the K generators
  (M3: one per language group, each with its own task and data) on the
  ``gen-results`` / ``sync`` flows; with one entry per generator (M3 on
  separate clusters) generator ``k`` is a process of its own, ``gen-<k>`` on
  its cluster, on ``gen-results-<k>`` / ``sync-<k>`` (``workers.electra.flows``).
* ``electra-root`` (rank 0 of the discriminator group): consumes every results
  stream, keeps share 0 of every step, scatters share ``r`` of each generator to
  the ``sub-disc-r`` queue, trains on its share like any rank, and after each
  step sends the sync token to every generator process.
* ``electra-sub`` (ranks 1..n_sub-1): trains on its ``sub-disc-r`` share;
  gradients are all-reduced over gloo (``paddle.distributed``).

Micro-batch identity: generator ``k``'s micro-batch ``r`` of step ``s`` has
``micro_batch = s * n_sub + r`` on its own producer stream, so a recomputed
micro-batch (after a restart) has the same message id and is deduplicated.
Data and vocabulary: ``workers.electra.data``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from nebula_mq.config import PATH
from nebula_mq.errors import ConfigError, DataError, WorkerError
from nebula_mq.models.group_address import GroupAddress
from nebula_mq.settings import Settings

MAX_AUTO_N = 8

# The roles' registered names: what plans launch and `worker --role` takes.
GENERATOR_ROLE = "electra-generator"
ROOT_ROLE = "electra-root"
SUB_ROLE = "electra-sub"

# Paddle names parameters and optimiser accumulators from a process-global
# generator that the trainers swap in and out; roles that share a process
# (unit tests, threads) must not interleave inside a trainer call.
PADDLE_TURN = threading.RLock()

if TYPE_CHECKING:  # the model module imports paddle; the launcher reads this one without it
    from nebula_mq.models.electra import ElectraConfig


@dataclass(frozen=True)
class ElectraJob:
    """The ``[electra]`` section of a job file (the model lives in ``[electra.model]``)."""

    # Passed to nebula_mq.models.electra.electra_config: preset + overrides.
    model: Mapping[str, Any] = field(default_factory=dict)
    # Cluster of each generator: one entry = one process hosting every generator;
    # one entry per generator = a process per generator on its own cluster (M3).
    generator_clusters: tuple[str, ...] = ("cluster-a",)
    # Cluster of the root discriminator and its sub-discriminator ranks.
    disc_cluster: str = "cluster-b"
    # Discriminator ranks (root + subs) = micro-batches per generator step; "auto"
    # measures both sides and picks it (resolve it once, before launching).
    n_sub: int | str = 1
    # Steps a generator may run ahead of the last sync token. It hides the WAN's round trip
    # (the lead must span it: round trip / the discriminator's step), and costs no accuracy:
    # a generator trains on its own data and never on what the discriminator sends back.
    max_lead: int = 8
    # Steps between checkpoints (and at the last step): what a restart may have to redo.
    checkpoint_every: int = 10
    # "synthetic": seeded toy languages (tests, tiny); "corpus": `nebula-mq data build` output.
    data: Literal["synthetic", "corpus"] = "synthetic"
    # Where `nebula-mq data build` wrote the corpus (data = "corpus").
    data_dir: str = field(default="run/data", metadata=PATH)
    # Corpus only: sentences loaded per generator (the rest of the file is not read).
    max_sentences: int = 20000
    # Corpus only: XLM-R pieces kept, most frequent first (plus the specials); 0 = the
    # model's vocab_size, or every piece of the corpus for the pretrained preset.
    max_vocab: int = 0
    # Last sentences of each generator's data, never trained on (held-out evaluation).
    heldout: int = 256
    # The host of the discriminator group's ranks when they all run on one host (disc_hosts unset).
    gloo_host: str = "127.0.0.1"
    # The host of each discriminator rank, in rank order (the root is rank 0), when the group
    # spans several hosts of disc_cluster; its rendezvous is on disc_hosts[0]. Empty: every
    # rank on gloo_host.
    disc_hosts: tuple[str, ...] = ()
    # The discriminator group's rendezvous port; rank r listens on gloo_base_port + 1 + r. Keep
    # it below the kernel's ephemeral range (Linux: 32768-60999), where outgoing connections
    # could take it.
    gloo_base_port: int = 29100
    # A collective (or the rendezvous) that has not completed after this long means a rank
    # is gone: the rank exits, and the group restarts from its last common checkpoint.
    group_timeout_s: float = 300.0
    # Hot start: a previous job's run_dir whose checkpoints seed workers that have none.
    init_from: str = ""

    def validate(self) -> None:
        if isinstance(self.n_sub, str) and self.n_sub != "auto":
            raise ValueError("n_sub: a positive integer or 'auto'")
        if isinstance(self.n_sub, int) and self.n_sub < 1:
            raise ValueError("n_sub >= 1")
        if self.max_lead < 0 or self.checkpoint_every < 1 or self.heldout < 0 or self.max_vocab < 0:
            raise ValueError("max_lead >= 0, checkpoint_every >= 1, heldout >= 0, max_vocab >= 0")
        if not self.group_timeout_s > 0:
            raise ValueError("group_timeout_s > 0")
        if not self.generator_clusters:
            raise ValueError("at least one generator cluster")
        if any(not h.strip() or ":" in h for h in self.disc_hosts):
            raise ValueError("disc_hosts: host names or addresses, without ports")
        if self.disc_hosts and isinstance(self.n_sub, int) and len(self.disc_hosts) != self.n_sub:
            raise ValueError(f"disc_hosts: one host per discriminator rank (n_sub = {self.n_sub}), "
                             f"got {len(self.disc_hosts)}")

    def group_address(self, world: int) -> GroupAddress:
        """Where the discriminator ranks meet (``models.group_address``), ``world`` of them."""
        if self.disc_hosts and len(self.disc_hosts) != world:
            raise WorkerError(f"electra.disc_hosts names {len(self.disc_hosts)} hosts for {world} "
                              f"discriminator ranks (n_sub)")
        return GroupAddress.on_hosts(self.disc_hosts or (self.gloo_host,) * world, self.gloo_base_port)

    @property
    def n(self) -> int:
        if not isinstance(self.n_sub, int):
            raise ConfigError("<electra>", "n_sub", "resolved with resolve_n_sub() before launch", self.n_sub)
        return self.n_sub

    def cluster_of(self, k: int) -> str:
        return self.generator_clusters[k] if len(self.generator_clusters) > 1 else self.generator_clusters[0]

    @property
    def process_per_generator(self) -> bool:
        """One generator process per generator (M3 layout), each on its own flows."""
        return len(self.generator_clusters) > 1


def model_config(settings: Settings, job: ElectraJob, vocab_kept: np.ndarray | None = None) -> ElectraConfig:
    """The ElectraConfig of this job: seed from [job], total steps from [job], n_sub micro-batches."""
    from nebula_mq.models.electra import electra_config

    cfg = electra_config(dict(job.model), settings.source or "<electra.model>")
    gens = tuple(dataclasses.replace(g, micro_batches=job.n) for g in cfg.generators)
    # The LR schedule spans job.steps unless the model section fixes it (a hot-started
    # job continues the schedule of the job it resumes: give both the same total_steps).
    horizon = int(job.model.get("total_steps", settings.job.steps))
    cfg = dataclasses.replace(cfg, generators=gens, seed=settings.job.seed, total_steps=horizon)
    if len(job.generator_clusters) not in (1, len(gens)):
        raise ConfigError(settings.source or "<settings>", "electra.generator_clusters",
                          f"1 or {len(gens)} entries (one per generator)", list(job.generator_clusters))
    return cfg.with_pruned_vocab(vocab_kept) if vocab_kept is not None else cfg


def generator_id(k: int) -> str:
    """Producer id of generator ``k``'s micro-batch stream (either layout)."""
    return f"gen-{k}"


def generator_worker_id(job: ElectraJob, k: int) -> str:
    """Worker id (checkpoints, logs, identity) of the process hosting generator ``k``."""
    return generator_id(k) if job.process_per_generator else "gen"


def disc_rank_id(rank: int) -> str:
    return "disc-root" if rank == 0 else f"disc-sub-{rank}"


# --------------------------------------------------------------------------- n_sub


def choose_n(gen_s_per_micro_batch: float, disc_s_per_micro_batch: float, max_n: int = MAX_AUTO_N) -> int:
    """Ranks so the discriminator side keeps pace with one generator (paper §3.3):
    the generator makes n micro-batches in n·t_G; n ranks train one each in ~t_D."""
    if gen_s_per_micro_batch <= 0 or disc_s_per_micro_batch <= 0:
        raise DataError("throughput measurements must be positive")
    return int(min(max_n, max(1, round(disc_s_per_micro_batch / gen_s_per_micro_batch))))
