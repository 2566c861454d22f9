"""The ``[electra]`` section as the workers use it: ``n_sub = "auto"`` resolved by a measurement.

Resolving ``auto`` times a generator and a discriminator step on the job's own data,
so this sits above both the job's definition (``workers.electra.common``) and its
data (``workers.electra.data``)."""

from __future__ import annotations

import dataclasses
import json

from nebula_mq import config
from nebula_mq.atomic import write_json_atomic
from nebula_mq.errors import DataError
from nebula_mq.settings import Settings
from workers.electra.common import MAX_AUTO_N, PADDLE_TURN, ElectraJob, choose_n
from workers.electra.data import load_streams


def load_job(settings: Settings) -> ElectraJob:
    """The section, with ``n_sub = "auto"`` resolved (see :func:`resolve_n_sub`)."""
    job = config.build(ElectraJob, dict(settings.section("electra")), settings.source or "<settings>", "electra.")
    if job.n_sub == "auto":
        job = dataclasses.replace(job, n_sub=resolve_n_sub(settings, job))
    return job


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
    with PADDLE_TURN:  # pretrained or not, the same architecture takes the same time
        gen, disc = GeneratorTrainer(cfg, 0), DiscriminatorTrainer(dataclasses.replace(cfg, init="random"))
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
    write_json_atomic(path, {"n_sub": n, "gen_s_per_micro_batch": t_g / repeats,
                             "disc_s_per_micro_batch": t_d / repeats})
    return n
