"""``nebula-mq export JOB.toml --out DIR``: a trained split job's halves, in their frameworks' formats.

Each side's weights at the newest checkpoint both sides share go to ``DIR`` as
``head.pdparams`` / ``head.pt`` and ``tail.*`` (``paddle.load`` / ``torch.load``
read them into the model the job's builder makes), with ``manifest.json``: job,
step, codecs, and per side its framework, file, sha256 and checkpoint digest.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

def register(sub: Any) -> None:
    p = sub.add_parser("export", help="write a trained split job's two halves and a manifest",
                       description="Write each side of a trained split job (the newest checkpoint both sides "
                       "share) in its framework's own format, with a manifest (job, step, codecs, digests). In Python: "
                       "workers.split.load(job, side), workers.split.predict(job, inputs).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="JOB.toml", help="the split job file the model was trained with")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to write the files into")
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from nebula_mq.errors import ConfigError
    from workers.registry import load_job_settings
    from workers.split import export

    settings = load_job_settings(args.config)
    if settings.job.scenario != "split":
        raise ConfigError(settings.source or args.config, "job.scenario",
                          "a split job (export writes [split] jobs' halves)", settings.job.scenario)
    manifest = export(settings, args.out)
    for side, entry in manifest["sides"].items():
        print(f"{side}: {args.out / entry['file']} ({entry['framework']}, step {manifest['step']}, "
              f"sha256 {entry['sha256'][:16]})")
    print(f"manifest: {args.out / 'manifest.json'}")
    return 0
