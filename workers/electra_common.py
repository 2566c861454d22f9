"""What the Scenario I roles share: the ``[electra]`` job section, flows, data, group start.

Role and process layout (paper §3.3, Figure 6):

* ``electra-generator`` (cluster A, one process hosting the K generators; M3:
  one per language group, each with its own task and data): each step every
  generator makes ``n_sub`` micro-batches
  (mask, MLM forward/backward, sample replacements), publishes each on the
  ``gen-results`` flow (ids and 0/1 masks, lz4; no embeddings), then applies
  its optimiser step.
* ``electra-root`` (cluster B, rank 0 of the discriminator group): consumes
  ``gen-results``, keeps share 0 of every step, scatters share ``r`` of each
  generator to the ``sub-disc-r`` queue, trains on its share like any rank,
  and after each step sends the sync token to every generator.
* ``electra-sub`` (cluster B, ranks 1..n_sub-1): trains on its ``sub-disc-r``
  share; gradients are all-reduced over gloo (``paddle.distributed``).

Micro-batch identity: generator ``k``'s micro-batch ``r`` of step ``s`` has
``micro_batch = s * n_sub + r`` on its own producer stream, so a recomputed
micro-batch (after a restart) has the same message id and is deduplicated.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from nebula_mq import config, topology
from nebula_mq.errors import ConfigError, DataError
from nebula_mq.settings import Settings

MAX_AUTO_N = 8

# Paddle names parameters and optimiser accumulators from a process-global
# generator that the trainers swap in and out; roles that share a process
# (unit tests, threads) must not interleave inside a trainer call.
PADDLE_TURN = threading.RLock()


@dataclass(frozen=True)
class ElectraJob:
    """The ``[electra]`` section of a job file (the model lives in ``[electra.model]``)."""

    # Passed to nebula_mq.models.electra.electra_config: preset + overrides.
    model: Mapping[str, Any] = field(default_factory=dict)
    # Cluster of each generator (one entry for all, or one per generator).
    generator_clusters: tuple[str, ...] = ("cluster-a",)
    disc_cluster: str = "cluster-b"
    # Discriminator ranks (root + subs) = micro-batches per generator step; "auto"
    # measures both sides and picks it (resolve it once, before launching).
    n_sub: int | str = 1
    # Steps a generator may run ahead of the last sync token (hides the WAN latency).
    max_lead: int = 2
    checkpoint_every: int = 10
    # "synthetic": seeded toy languages (tests, tiny); "corpus": `nebula-mq data build` output.
    data: Literal["synthetic", "corpus"] = "synthetic"
    data_dir: str = "run/data"
    # Corpus only: sentences loaded per generator (the rest of the file is not read).
    max_sentences: int = 20000
    # Last sentences of each generator's data, never trained on (held-out evaluation).
    heldout: int = 256
    # gloo rendezvous of the discriminator group: master on base_port, rank r on base_port+1+r.
    gloo_host: str = "127.0.0.1"
    gloo_base_port: int = 36100
    # Hot start: a previous job's run_dir whose checkpoints seed workers that have none.
    init_from: str = ""

    def validate(self) -> None:
        if isinstance(self.n_sub, str) and self.n_sub != "auto":
            raise ValueError("n_sub: a positive integer or 'auto'")
        if isinstance(self.n_sub, int) and self.n_sub < 1:
            raise ValueError("n_sub >= 1")
        if self.max_lead < 0 or self.checkpoint_every < 1 or self.heldout < 0:
            raise ValueError("max_lead >= 0, checkpoint_every >= 1, heldout >= 0")
        if not self.generator_clusters:
            raise ValueError("at least one generator cluster")

    @property
    def n(self) -> int:
        if not isinstance(self.n_sub, int):
            raise ConfigError("<electra>", "n_sub", "resolved with resolve_n_sub() before launch", self.n_sub)
        return self.n_sub

    def cluster_of(self, k: int) -> str:
        return self.generator_clusters[k] if len(self.generator_clusters) > 1 else self.generator_clusters[0]


def load_job(settings: Settings) -> ElectraJob:
    """The section, with ``n_sub = "auto"`` resolved (see :func:`resolve_n_sub`)."""
    job = config.build(ElectraJob, dict(settings.electra), settings.source or "<settings>", "electra.")
    if job.n_sub == "auto":
        job = dataclasses.replace(job, n_sub=resolve_n_sub(settings, job))
    return job


def plan(settings: Settings) -> Any:
    """The job's processes (``workers.plans.Plan``): generator, root, subs 1..n-1."""
    from workers.plans import Plan, Process

    job = load_job(settings)
    subs = tuple(topology.sub_discriminator_flow(r) for r in range(1, job.n))
    # Each process may touch exactly its flows (least-privilege broker permissions).
    procs = [Process("electra-root", job.disc_cluster, disc_rank_id(0), 0,
                     publishes=("sync", *subs), consumes=("gen-results",))]
    procs += [Process("electra-sub", job.disc_cluster, disc_rank_id(r), r,
                      consumes=(topology.sub_discriminator_flow(r),)) for r in range(1, job.n)]
    procs.append(Process("electra-generator", job.cluster_of(0), "gen", 0,
                         publishes=("gen-results",), consumes=("sync",)))
    return Plan(tuple(procs), flows(job))


def model_config(settings: Settings, job: ElectraJob, vocab_kept: np.ndarray | None = None) -> Any:
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
    return f"gen-{k}"


def disc_rank_id(rank: int) -> str:
    return "disc-root" if rank == 0 else f"disc-sub-{rank}"


def flows(job: ElectraJob) -> tuple[topology.Flow, ...]:
    """The job's flows (topology.electra_flows). M3 generators share one cluster for now:
    one ``sync`` queue serves one generator process, which hosts all K generators;
    a generator per cluster needs per-generator gen-results/sync flows in topology."""
    if len(set(job.generator_clusters)) != 1:
        raise ConfigError("<electra>", "generator_clusters", "one cluster for all generators "
                          "(per-cluster generators need per-generator flows in topology)",
                          list(job.generator_clusters))
    return topology.electra_flows(job.cluster_of(0), job.disc_cluster, job.n)


def flow_named(all_flows: Sequence[topology.Flow], name: str) -> topology.Flow:
    return next(f for f in all_flows if f.name == name)


# --------------------------------------------------------------------------- data


class TokenStream:
    """One generator's examples (ids rows, or (src, tgt) pairs), addressed by micro-batch index."""

    def __init__(self, examples: list[Any], batch_size: int, seed: int, heldout: int) -> None:
        if len(examples) < batch_size + heldout:
            raise DataError(f"{len(examples)} examples: fewer than one batch of {batch_size} + {heldout} held out")
        self.train = examples[: len(examples) - heldout]
        self.heldout = examples[len(self.train):]
        self.batch_size, self.seed = batch_size, seed
        self.per_epoch = len(self.train) // batch_size

    def batch(self, index: int) -> list[Any]:
        epoch, k = divmod(index, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
        return [self.train[i] for i in order[k * self.batch_size: (k + 1) * self.batch_size]]

    def heldout_batches(self) -> list[list[Any]]:
        b = self.batch_size
        return [self.heldout[i: i + b] for i in range(0, len(self.heldout) - b + 1, b)]


def synthetic_examples(task: str, group: str, vocab: int, max_len: int, n: int, seed: int) -> list[Any]:
    """Toy languages: each group is a sparse Markov chain over its own 48 ids (3 successors
    per token), so masked tokens are predictable from context and a tiny MLM learns within
    tens of steps. ``trtd`` pairs a sentence with its image under a fixed id permutation."""
    rng = np.random.default_rng([seed, sum(group.encode())])
    words = rng.choice(np.arange(5, vocab), size=min(48, vocab - 5), replace=False)
    succ = {int(w): rng.choice(words, size=3) for w in words}
    perm = dict(zip(words.tolist(), rng.permutation(words).tolist()))
    longest = max(7, max_len // 2 - 2 if task == "trtd" else max_len - 2)
    out: list[Any] = []
    for _ in range(n):
        row = [int(rng.choice(words))]
        for _ in range(int(rng.integers(6, longest + 1)) - 1):
            row.append(int(succ[row[-1]][rng.integers(0, 3)]))
        out.append((row, [perm[t] for t in row]) if task == "trtd" else row)
    return out


def _families(group: str, data_dir: Path) -> list[Path]:
    ml = data_dir / "multilingual"
    files = sorted(p for p in ml.glob("*.jsonl") if not p.name.startswith("trtd_"))
    if group != "all":
        wanted = set(group.split("+"))
        files = [p for p in files if p.stem in wanted]
        if len(files) != len(wanted):
            raise DataError(f"language group {group!r}: no {sorted(wanted - {p.stem for p in files})} "
                            f"under {ml} (run `nebula-mq data build`)")
    if not files:
        raise DataError(f"no multilingual data under {ml} (run `nebula-mq data build`)")
    return files


def corpus_texts(task: str, group: str, data_dir: Path, limit: int) -> list[Any]:
    """Texts of one generator: round-robin over the group's family files (or es/en pairs)."""
    if task == "trtd":
        path = data_dir / "multilingual" / "trtd_es_en.jsonl"
        if not path.exists():
            raise DataError(f"{path} missing (run `nebula-mq data build`)")
        with path.open(encoding="utf-8") as fh:
            rows = [json.loads(line) for _, line in zip(range(limit), fh)]
        return [(r["src"], r["tgt"]) for r in rows]
    per_file = max(1, limit // len(files := _families(group, data_dir)))
    columns = []
    for p in files:
        with p.open(encoding="utf-8") as fh:
            columns.append([json.loads(line)["text"] for _, line in zip(range(per_file), fh)])
    texts = [c[i] for i in range(max(map(len, columns))) for c in columns if i < len(c)]
    rng = np.random.default_rng(len(texts))  # held-out = a random sample, not the last family
    return [texts[i] for i in rng.permutation(len(texts))][:limit]


def tokenize_corpus(examples: list[Any]) -> list[Any]:
    from nebula_mq.models.tokenizers import load_xlmr_tokenizer

    tok = load_xlmr_tokenizer()
    if examples and isinstance(examples[0], tuple):
        src = tok.encode_batch([a for a, _ in examples])
        tgt = tok.encode_batch([b for _, b in examples])
        return [(s.ids, t.ids) for s, t in zip(src, tgt)]
    return [e.ids for e in tok.encode_batch(examples)]


def kept_vocabulary(token_rows: Sequence[Sequence[Sequence[int]]], size: int) -> np.ndarray:
    """The ``size`` most frequent original XLM-R ids (ties by id) plus the specials, sorted."""
    from nebula_mq.models.electra import XLMR_SPECIALS

    counts: dict[int, int] = {}
    for rows in token_rows:
        for row in rows:
            for t in row:
                counts[t] = counts.get(t, 0) + 1
    specials = set(XLMR_SPECIALS.values())
    ranked = sorted((t for t in counts if t not in specials), key=lambda t: (-counts[t], t))
    return np.array(sorted(specials | set(ranked[: max(0, size - len(specials))])), dtype=np.int64)


def remap(row: Sequence[int], kept: np.ndarray, unk_new: int) -> list[int]:
    arr = np.asarray(row, dtype=np.int64)
    pos = np.clip(np.searchsorted(kept, arr), 0, len(kept) - 1)
    return np.where(kept[pos] == arr, pos, unk_new).tolist()


def corpus_vocabulary(settings: Settings, job: ElectraJob, cfg: Any) -> tuple[np.ndarray, list[list[Any]]]:
    """(kept original XLM-R ids, each generator's tokenized corpus) of a ``data = "corpus"`` job.

    The probe (workers.electra_probe) calls it too: it must map text into the
    same pruned vocabulary the discriminator was trained with.
    """
    texts = [corpus_texts(g.task, g.group, Path(job.data_dir), job.max_sentences) for g in cfg.generators]
    tokenized = [tokenize_corpus(t) for t in texts]
    flat = [[x for ex in rows for x in ((ex,) if not isinstance(ex, tuple) else ex)] for rows in tokenized]
    return kept_vocabulary(flat, cfg.vocab_size), tokenized


def load_streams(settings: Settings, job: ElectraJob) -> tuple[Any, list[TokenStream]]:
    """(ElectraConfig, one TokenStream per generator). Deterministic: every process of the
    job (generators and discriminator ranks) derives the same pruned vocabulary."""
    cfg = model_config(settings, job)
    seed = settings.job.seed
    if job.data == "synthetic":
        raw = [synthetic_examples(g.task, g.group, cfg.vocab_size, cfg.max_len, 4096, seed)
               for g in cfg.generators]
    else:
        kept, tokenized = corpus_vocabulary(settings, job, cfg)
        cfg = model_config(settings, job, kept)
        raw = [[tuple(remap(x, kept, cfg.unk_id) for x in ex) if isinstance(ex, tuple) else remap(ex, kept, cfg.unk_id)
                for ex in rows] for rows in tokenized]
    streams = [TokenStream(r, cfg.batch_size, seed * 7919 + k, job.heldout) for k, r in enumerate(raw)]
    return cfg, streams


# --------------------------------------------------------------------------- n_sub


def choose_n(gen_s_per_micro_batch: float, disc_s_per_micro_batch: float, max_n: int = MAX_AUTO_N) -> int:
    """Ranks so the discriminator side keeps pace with one generator (paper §3.3):
    the generator makes n micro-batches in n·t_G; n ranks train one each in ~t_D."""
    if gen_s_per_micro_batch <= 0 or disc_s_per_micro_batch <= 0:
        raise DataError("throughput measurements must be positive")
    return int(min(max_n, max(1, round(disc_s_per_micro_batch / gen_s_per_micro_batch))))


def resolve_n_sub(settings: Settings, job: ElectraJob, max_n: int = MAX_AUTO_N, repeats: int = 3) -> int:
    """``n_sub = "auto"``: time a generator and a discriminator step here and pick n.

    The first process of the job to ask (``nebula-mq run`` builds the plan before
    starting workers) measures and writes ``<run_dir>/electra-n-sub.json``; every
    later process reads it, so all ranks agree. Delete the file to measure again.
    """
    path = settings.run_dir / "electra-n-sub.json"
    if path.exists():
        try:
            return int(json.loads(path.read_text())["n_sub"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path} is unreadable ({exc}); delete it to measure again") from None
    import time

    from nebula_mq.models.electra_trainers import DiscriminatorTrainer, GeneratorTrainer

    cfg, streams = load_streams(settings, dataclasses.replace(job, n_sub=1))
    with PADDLE_TURN:
        gen, disc = GeneratorTrainer(cfg, 0), DiscriminatorTrainer(cfg)
        t_g = t_d = 0.0
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            batch, _ = gen.train_step(gen.build_inputs(streams[0].batch(i)))
            t1 = time.perf_counter()
            disc.train_step(batch)
            t2 = time.perf_counter()
            if i:  # the first step pays for lazy initialisation
                t_g, t_d = t_g + t1 - t0, t_d + t2 - t1
    n = choose_n(t_g / repeats, t_d / repeats, max_n)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"n_sub": n, "gen_s_per_micro_batch": t_g / repeats,
                               "disc_s_per_micro_batch": t_d / repeats}))
    os.replace(tmp, path)
    return n
