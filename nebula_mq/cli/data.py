"""``nebula-mq data build|stats``: the offline corpora (see ``nebula_mq.data``);
``nebula-mq data-access grant|revoke|list``: a data owner lets a job read a named dataset."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nebula_mq.cli.options import AUDIT_HELP, LOG_LEVELS, audit_log


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("data", help="build and inspect the offline corpora")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    b = sub.add_parser("build", help="build the parallel, multilingual and tokenized corpora")
    b.add_argument("--out", type=Path, default=None, help="data directory (default $NEBULA_DATA_DIR or run/data)")
    b.add_argument("--max-pairs", type=int, default=None, help="cap on parallel pairs per domain")
    b.add_argument("--max-texts", type=int, default=None, help="cap on multilingual texts per language")
    b.add_argument("--no-download", action="store_true", help="use only cached Debian packages")
    b.add_argument("--no-tokenize", action="store_true", help="skip the tokenized arrays")
    b.add_argument("--languages", nargs="+", default=None, metavar="ISO", help="languages of the multilingual corpus")
    b.add_argument("--seed", type=int, default=0, help="seed of the train/valid/test split (default 0)")
    b.add_argument("--max-len", type=int, default=128, help="token limit per sentence in the tokenized arrays")
    b.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                   help="log detail (default warning; debug lists every skipped input)")
    b.set_defaults(func=_build)

    s = sub.add_parser("stats", help="print the manifest of a built data directory")
    s.add_argument("--data-dir", "--out", dest="out", type=Path, default=None, metavar="DIR",
                   help="the built data directory to read (default $NEBULA_DATA_DIR or run/data)")
    s.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    s.set_defaults(func=_stats)

    parser = subparsers.add_parser("data-access", help="grant jobs access to datasets (data owners)")
    sub = parser.add_subparsers(dest="data_access_cmd", metavar="CMD", required=True)
    for name, func, text in (("grant", _grant, "let JOB read OWNER's DATASET (signed by OWNER's key)"),
                             ("revoke", _revoke, "withdraw the grant")):
        p = sub.add_parser(name, help=text)
        p.add_argument("root", metavar="ROOT", help="data root (datasets/, owners/, grants/)")
        p.add_argument("owner", metavar="OWNER", help="the data owner who signs the grant")
        p.add_argument("job", metavar="JOB", help="the job id the grant is for")
        p.add_argument("dataset", metavar="DATASET", help="one of OWNER's datasets under ROOT/datasets")
        p.add_argument("--audit", help=AUDIT_HELP)
        p.set_defaults(func=func)
    ls = sub.add_parser("list", help="OWNER's grants (after checking their signature)")
    ls.add_argument("root", metavar="ROOT", help="data root (datasets/, owners/, grants/)")
    ls.add_argument("owner", metavar="OWNER", help="whose grants to list")
    ls.set_defaults(func=_list)


def _build(args: argparse.Namespace) -> int:
    from nebula_mq.data.build import STAGES, BuildOptions, build, default_data_dir
    from nebula_mq.errors import DataError
    from nebula_mq.runtime.logs import configure_logging

    # Logs go to stderr so stdout carries only the summary.
    configure_logging(args.log_level)
    if args.max_pairs is not None and args.max_pairs < 1:
        raise DataError(f"--max-pairs must be positive, got {args.max_pairs}")
    options = BuildOptions(
        out=args.out or default_data_dir(),
        seed=args.seed,
        max_pairs=args.max_pairs,
        download=not args.no_download,
        languages=tuple(args.languages) if args.languages else None,
        max_texts_per_language=args.max_texts,
        max_len=args.max_len,
        tokenize=not args.no_tokenize,
    )
    if sys.stderr.isatty():
        from tqdm import tqdm

        with tqdm(total=len(STAGES), desc="data build", unit="stage") as bar:

            def on_stage(name: str) -> None:
                bar.set_postfix_str(name)
                bar.update(0 if bar.n == 0 and name == STAGES[0] else 1)

            manifest, built = build(options, on_stage)
            bar.update(bar.total - bar.n)
    else:
        manifest, built = build(options)
    print(("built " if built else "up to date: ") + str(options.out))
    print(summary(manifest))
    return 0


def _stats(args: argparse.Namespace) -> int:
    from nebula_mq.data.build import default_data_dir, read_manifest
    from nebula_mq.errors import DataError

    out = args.out or default_data_dir()
    manifest = read_manifest(out)
    if manifest is None:
        raise DataError(f"{out}: no manifest (run `nebula-mq data build`)")
    print(json.dumps(manifest, indent=2, ensure_ascii=False) if args.json else summary(manifest))
    return 0


def summary(manifest: dict[str, Any]) -> str:
    """Human-readable counts: pairs per domain and split, languages per family, skipped inputs."""
    lines = ["parallel es→en pairs:"]
    counts = manifest.get("parallel", {}).get("counts", {})
    for domain, by_split in sorted(counts.items()):
        split_text = "  ".join(f"{s}={by_split[s]}" for s in ("train", "valid", "test") if s in by_split)
        lines.append(f"  {domain:<10} {split_text}  total={sum(by_split.values())}")
    multilingual = manifest.get("multilingual", {})
    families = multilingual.get("families", {})
    lines.append(f"multilingual: {multilingual.get('languages', 0)} languages in {len(families)} families")
    for family, info in families.items():
        langs = info.get("languages", {})
        lines.append(f"  {family:<14} {len(langs):>3} languages {info.get('rows', 0):>8} texts")
    trtd = multilingual.get("trtd")
    if trtd:
        lines.append(f"  trtd es-en    {trtd.get('rows', 0):>8} pairs")
    inputs = manifest.get("inputs", {})
    skipped = inputs.get("parallel", {}).get("skipped_count", 0) + inputs.get("multilingual", {}).get("skipped_count", 0)
    lines.append(f"inputs: {inputs.get('catalogues', 0)} catalogues, {skipped} skipped (corrupt or empty)")
    tokenized = manifest.get("tokenized", {})
    if "files" in tokenized:
        vocab = tokenized["files"].get("src_used_token_ids", {}).get("rows", 0)
        lines.append(f"tokenized: max_len={tokenized.get('max_len')}, {vocab} source token ids in use")
    else:
        lines.append(f"tokenized: skipped ({tokenized.get('skipped', 'unknown')})")
    return "\n".join(lines)


def _owner(args: argparse.Namespace) -> Any:
    from nebula_mq.security.data_access import DataOwner

    return DataOwner(args.root, args.owner, audit_log(args.audit))


def _grant(args: argparse.Namespace) -> int:
    _owner(args).grant(args.job, args.dataset)
    print(f"{args.owner}/{args.dataset}: granted to job {args.job}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    _owner(args).revoke(args.job, args.dataset)
    print(f"{args.owner}/{args.dataset}: grant to job {args.job} withdrawn")
    return 0


def _list(args: argparse.Namespace) -> int:
    from nebula_mq.security.data_access import load_grants

    for g in load_grants(args.root, args.owner):
        print(f"{args.owner}/{g.dataset} -> job {g.job}")
    return 0
