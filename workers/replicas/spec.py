"""The user's model of a replicas job: the :class:`~workers.replicas.job.ReplicaSpec` that
``[replicas] model`` (``module:function``) makes for each cluster, from the user's module next
to the job file or in ``model_dir``."""

from __future__ import annotations

import inspect
from pathlib import Path

from nebula_mq import config
from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings
from workers.replicas.job import ReplicaSpec, load_job


def load_spec(settings: Settings, c: int) -> ReplicaSpec:
    """The :class:`ReplicaSpec` the job's ``[replicas] model`` function makes for replica ``c``;
    anything else is a one-line ConfigError."""
    job = load_job(settings)
    where = settings.source or "<settings>"
    # The user's module sits next to the job file, or in model_dir (relative to the job file).
    home = (Path(settings.source).resolve().parent / job.model_dir).resolve() if settings.source else None
    builder = config.load_function(where, "replicas.model", job.model, home)
    try:
        inspect.signature(builder).bind(settings, c)
    except (TypeError, ValueError):
        raise ConfigError(where, "replicas.model", "a function(settings, cluster index) returning ReplicaSpec",
                          job.model) from None
    spec = builder(settings, c)
    if not isinstance(spec, ReplicaSpec):
        raise ConfigError(where, "replicas.model", "a function returning ReplicaSpec", type(spec).__name__)
    return spec
