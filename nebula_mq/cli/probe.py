"""``nebula-mq probe JOB.toml``: cross-lingual transfer of a Scenario I discriminator.

Trains a linear head on English UI strings (which software catalogue a string
comes from) over each encoder's frozen mean-pooled states and prints accuracy
per language; ``--json`` also writes the figures to a file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("probe", help="cross-lingual transfer probe of a Scenario I run's discriminator")
    p.add_argument("config", help="the run's job TOML file (its run_dir holds the checkpoints)")
    p.add_argument("--encoders", default="discriminator,e5-small,random",
                   help="comma-separated: discriminator, e5-small, random")
    p.add_argument("--domains", default="", help="comma-separated catalogue names (default: the built-in six)")
    p.add_argument("--locales", default="es,de,fr,ru,zh_CN", help="comma-separated target locales")
    p.add_argument("--per-class", type=int, default=300, help="sentences per (language, domain) class (default 300)")
    p.add_argument("--epochs", type=int, default=300, help="training epochs of the linear probe (default 300)")
    p.add_argument("--json-out", dest="json_path", metavar="PATH", default="", help="also write the results as JSON to PATH")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nebula_mq.data.probe import DEFAULT_DOMAINS, build_probe_set
    from workers.registry import load_job_settings
    from workers.electra.probe import probe_run

    settings = load_job_settings(args.config)
    domains = tuple(d for d in args.domains.split(",") if d) or DEFAULT_DOMAINS
    locales = tuple(x for x in args.locales.split(",") if x)
    probe = build_probe_set(domains, locales, per_class=args.per_class, seed=settings.job.seed)
    results = probe_run(settings, probe, tuple(e for e in args.encoders.split(",") if e), epochs=args.epochs)
    langs = probe.languages
    print(f"{len(probe.classes)} classes, {len(probe.train_texts)} English training strings, "
          f"{len(probe.test_labels)} held-out per language; chance {next(iter(results.values())).chance:.3f}")
    print(f"{'encoder':<14}{'train':>7}" + "".join(f"{lang:>7}" for lang in langs) + f"{'xfer':>7}")
    for name, r in results.items():
        print(f"{name:<14}{r.train_accuracy:7.3f}" + "".join(f"{r.accuracy[lang]:7.3f}" for lang in langs)
              + f"{r.mean_transfer():7.3f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {name: {"accuracy": r.accuracy, "train_accuracy": r.train_accuracy, "chance": r.chance,
                    "mean_transfer": r.mean_transfer(), "classes": list(r.classes)}
             for name, r in results.items()}, indent=2))
    return 0
