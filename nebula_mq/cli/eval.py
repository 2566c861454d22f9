"""``nebula-mq eval JOB.toml --src FILE --ref FILE``: score a trained ABNet job on any parallel text.

S's half encodes with S's latest checkpoint, the activation goes through the
job's forward codec as over the WAN, T's half beam-decodes with T's latest
checkpoint (``workers.abnet.translate``). Scores are sacrebleu's BLEU and chrF,
case-insensitive as in the paper. The hypotheses go to ``--out`` (default
``<run_dir>/eval/<src name>.hyp``) and the scores with every hypothesis beside
its reference to ``<run_dir>/eval-<src name>.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from nebula_mq.errors import DataError
from nebula_mq.atomic import write_json_atomic

EPILOG = """example:
  nebula-mq eval config/abnet-corpus.toml --src news.es --ref news.en --out news.hyp
files: UTF-8 text, one sentence per line, the same number of lines in both."""


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="score a trained ABNet job on parallel text (BLEU, chrF)",
                       description="Score a trained ABNet job on any parallel text: S encodes, the activation "
                       "crosses the job's forward codec, T beam-decodes; BLEU and chrF, case-insensitive.",
                       epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="JOB.toml", help="the job file the model was trained with")
    p.add_argument("--src", required=True, type=Path, help="source sentences (Spanish), one per line")
    p.add_argument("--ref", required=True, type=Path, help="reference translations (English), one per line")
    p.add_argument("--out", type=Path, default=None, help="where to write the hypotheses, one per line "
                   "(default <run_dir>/eval/<src name>.hyp)")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy); default 4 as in the paper")
    p.add_argument("--max-len", type=int, default=64, help="longest hypothesis in tokens (default 64)")
    p.set_defaults(func=_eval)


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
