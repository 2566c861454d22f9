"""What a trained job's model does, from the command line.

``nebula-mq eval JOB.toml --src FILE --ref FILE``: score a trained ABNet job on any parallel text.
S's half encodes with S's latest checkpoint, the activation goes through the
job's forward codec as over the WAN, T's half beam-decodes with T's latest
checkpoint (``workers.abnet.translate``). Scores are sacrebleu's BLEU and chrF,
case-insensitive as in the paper. The hypotheses go to ``--out`` (default
``<run_dir>/eval/<src name>.hyp``) and the scores with every hypothesis beside
its reference to ``<run_dir>/eval-<src name>.json``.

``nebula-mq export JOB.toml --out DIR``: a trained split job's halves, in their frameworks'
formats. Each side's weights at the newest checkpoint both sides share go to ``DIR`` as
``head.pdparams`` / ``head.pt`` and ``tail.*`` (``paddle.load`` / ``torch.load``
read them into the model the job's builder makes), with ``manifest.json``: job,
step, codecs, and per side its framework, file, sha256 and checkpoint digest.

``nebula-mq probe JOB.toml``: cross-lingual transfer of a Scenario I discriminator. Trains a
linear head on English UI strings (which software catalogue a string comes from) over each
encoder's frozen mean-pooled states and prints accuracy per language; ``--json`` also writes
the figures to a file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nebula_mq.atomic import write_json_atomic
from nebula_mq.errors import ConfigError, DataError

def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="score a trained ABNet job on parallel text (BLEU, chrF)",
                       description="Score a trained ABNet job on any parallel text: S encodes, the activation "
                       "crosses the job's forward codec, T beam-decodes; BLEU and chrF, case-insensitive.")
    p.add_argument("config", metavar="JOB.toml", help="the job file the model was trained with")
    p.add_argument("--src", required=True, type=Path, help="source sentences (Spanish), one per line")
    p.add_argument("--ref", required=True, type=Path, help="reference translations (English), one per line")
    p.add_argument("--out", type=Path, default=None, help="where to write the hypotheses, one per line "
                   "(default <run_dir>/eval/<src name>.hyp)")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy); default 4 as in the paper")
    p.add_argument("--max-len", type=int, default=64, help="longest hypothesis in tokens (default 64)")
    p.set_defaults(func=_eval)

    p = sub.add_parser("export", help="write a trained split job's two halves and a manifest",
                       description="Write each side of a trained split job (the newest checkpoint both sides "
                       "share) in its framework's own format, with a manifest (job, step, codecs, digests). In Python: "
                       "workers.split.load(job, side), workers.split.predict(job, inputs).")
    p.add_argument("config", metavar="JOB.toml", help="the split job file the model was trained with")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to write the files into")
    p.set_defaults(func=_export)

    p = sub.add_parser("probe", help="cross-lingual transfer probe of a Scenario I run's discriminator")
    p.add_argument("config", help="the run's job TOML file (its run_dir holds the checkpoints)")
    p.add_argument("--encoders", default="discriminator,e5-small,random",
                   help="comma-separated: discriminator, e5-small, random")
    p.add_argument("--domains", default="", help="comma-separated catalogue names (default: the built-in six)")
    p.add_argument("--locales", default="es,de,fr,ru,zh_CN", help="comma-separated target locales")
    p.add_argument("--per-class", type=int, default=300, help="sentences per (language, domain) class (default 300)")
    p.add_argument("--epochs", type=int, default=300, help="training epochs of the linear probe (default 300)")
    p.add_argument("--json-out", dest="json_path", metavar="PATH", default="", help="also write the results as JSON to PATH")
    p.set_defaults(func=_probe)


def read_lines(path: Path, what: str) -> list[str]:
    """The sentences of a UTF-8 text file; DataError (one line) for anything else."""
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise DataError(f"{what} file {path} is a directory") from None
    except OSError as exc:
        raise DataError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{what} file {path} is not UTF-8 (line {line}, byte {exc.start})") from None
    lines = text.splitlines()
    if not lines or not any(s.strip() for s in lines):
        raise DataError(f"{what} file {path} is empty")
    return lines


def _eval(args: argparse.Namespace) -> int:
    from workers.registry import load_job_settings

    if args.beam < 1 or args.max_len < 1:
        raise DataError(f"--beam and --max-len must be at least 1, got {args.beam} and {args.max_len}")
    settings = load_job_settings(args.config)
    if settings.job.scenario != "abnet":
        raise DataError(f"{args.config}: nebula-mq eval scores ABNet jobs, this one is {settings.job.scenario!r}")
    sources, references = read_lines(args.src, "source"), read_lines(args.ref, "reference")
    if len(sources) != len(references):
        raise DataError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}: "
                        "one reference per source sentence")
    from nebula_mq.evaluation.bleu import evaluation_body
    from workers.abnet.translate import Translator

    translator = Translator(settings)
    print(f"translating {len(sources)} sentences (encoder step {translator.sides.steps[0]}, "
          f"decoder step {translator.sides.steps[1]}, beam {args.beam})", flush=True)
    hyps = translator.translate(sources, beam=args.beam, max_len=args.max_len)
    name = args.src.name
    out = args.out or settings.run_dir / "eval" / f"{name}.hyp"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    body = evaluation_body(name, list(range(len(hyps))), hyps, references, ["all"] * len(hyps), beam=args.beam)
    body["sources"] = sources
    scores_path = settings.run_dir / f"eval-{name}.json"
    write_json_atomic(scores_path, body, ensure_ascii=False)
    print(f"BLEU {body['bleu']:.2f}  chrF {body['chrf']:.2f}  ({len(hyps)} sentences, case-insensitive)")
    print(f"hypotheses: {out}\nscores: {scores_path}")
    return 0


def _export(args: argparse.Namespace) -> int:
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


def _probe(args: argparse.Namespace) -> int:
    from nebula_mq.data.probe import DEFAULT_DOMAINS, build_probe_set
    from workers.electra.probe import probe_run
    from workers.registry import load_job_settings

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
