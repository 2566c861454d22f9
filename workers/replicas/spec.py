"""The user's model of a replicas job: the :class:`~workers.replicas.job.ReplicaSpec` that
``[replicas] model`` (``module:function``) makes for each cluster, from the user's module next
to the job file or in ``model_dir``."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings
from workers.replicas.job import ReplicaSpec, load_job


def load_spec(settings: Settings, c: int) -> ReplicaSpec:
    """The :class:`ReplicaSpec` the job's ``[replicas] model`` function makes for replica ``c``;
    anything else is a one-line ConfigError."""
    job = load_job(settings)
    where, target = settings.source or "<settings>", job.model
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(where, "replicas.model", "'package.module:function'", target or "<empty>")
    if settings.source:  # the user's module sits next to the job file, or in model_dir
        home = str((Path(settings.source).resolve().parent / job.model_dir).resolve())
        if home not in sys.path:
            sys.path.append(home)
    try:
        builder = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(where, "replicas.model", "an importable 'module:function'", f"{target} ({exc})") from None
    try:
        inspect.signature(builder).bind(settings, c)
    except (TypeError, ValueError):
        raise ConfigError(where, "replicas.model", "a function(settings, cluster index) returning ReplicaSpec",
                          target) from None
    spec = builder(settings, c)
    if not isinstance(spec, ReplicaSpec):
        raise ConfigError(where, "replicas.model", "a function returning ReplicaSpec", type(spec).__name__)
    return spec
