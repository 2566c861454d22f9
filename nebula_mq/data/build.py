"""Build every corpus into one data directory, described by ``manifest.json``.

The manifest records the options, a fingerprint of the inputs, the counts per
domain and split, the languages per family, the skipped inputs and the sha256
of every output. A second build with the same options and inputs finds a
matching manifest and intact outputs and does nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from nebula_mq import __version__
from nebula_mq.data import bible, catalogues, debian
from nebula_mq.data.corpus_io import InputReport, read_jsonl, sha256_file
from nebula_mq.data.multilingual import collect_texts, write_multilingual
from nebula_mq.data.parallel import SPLITS, ParallelPair, SplitFractions, bible_pairs, gettext_pairs, write_parallel
from nebula_mq.errors import DataError
from nebula_mq.atomic import write_atomic

log = structlog.get_logger(__name__)

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
DATA_DIR_ENV = "NEBULA_DATA_DIR"
DEFAULT_DATA_DIR = "run/data"
LIBREOFFICE_PACKAGES = ("libreoffice-l10n-es",)
STAGES = ("fetch", "parallel", "multilingual", "tokenize", "manifest")


def default_data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)


@dataclass(frozen=True)
class BuildOptions:
    out: Path
    seed: int = 0
    # Cap on pairs per domain of the parallel corpus (every split shrinks alike); None keeps all.
    max_pairs: int | None = None
    # Run apt-get download for missing packages; False uses only what the cache holds.
    download: bool = True
    # ISO 639 codes of the multilingual corpus; None takes every installed language.
    languages: tuple[str, ...] | None = None
    max_texts_per_language: int | None = None
    # Locales whose catalogues give the parallel corpus's source side.
    source_locales: tuple[str, ...] = ("es",)
    catalogue_roots: tuple[str, ...] = catalogues.DEFAULT_ROOTS
    # Downloaded packages live here (default: <out>/cache), outside what the manifest digests.
    cache_dir: Path | None = None
    fractions: SplitFractions = field(default_factory=SplitFractions)
    max_len: int = 128
    tokenize: bool = True

    @property
    def cache(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.out / "cache"

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        for key in ("out", "cache_dir"):
            fields.pop(key)
        return json.loads(json.dumps(fields, default=str))


def build(options: BuildOptions, on_stage: Callable[[str], None] | None = None) -> tuple[dict[str, Any], bool]:
    """(manifest, built): builds unless a matching manifest with intact outputs exists."""
    stage = on_stage or (lambda _name: None)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)

    stage("fetch")
    packages = LIBREOFFICE_PACKAGES + bible.PACKAGES
    fetched = debian.fetch(list(packages), options.cache, download=options.download)
    cache_root = debian.unpacked_root(options.cache)
    cats = catalogues.discover(options.catalogue_roots)
    if fetched.get("libreoffice-l10n-es"):
        cats += catalogues.discover(
            [str(cache_root / "usr/lib/libreoffice/program/resource")], prefix="libreoffice/"
        )
    fingerprint = _fingerprint(options, cats, fetched)
    existing = read_manifest(out)
    if existing is not None and existing.get("fingerprint") == fingerprint and verify_outputs(out, existing):
        log.info("data.build_skipped", out=str(out), why="manifest matches inputs")
        return existing, False

    report = InputReport()
    stage("parallel")
    source = [c for c in cats if c.locale in options.source_locales]
    domains: dict[str, list[ParallelPair]] = {"gettext": gettext_pairs(source, report)}
    if fetched.get("sword-text-sparv") and fetched.get("sword-text-web"):
        try:
            domains["bible"] = bible_pairs(bible.load_pairs(cache_root))
        except DataError as exc:
            report.skip(cache_root / "usr/share/sword", str(exc))
    else:
        log.warning("data.bible_unavailable", why="sword-text packages neither cached nor downloadable")
    parallel = write_parallel(
        out / "parallel", out, domains, fractions=options.fractions, seed=options.seed, max_pairs=options.max_pairs
    )

    stage("multilingual")
    multilingual_report = InputReport()
    texts = collect_texts(
        cats, multilingual_report, languages=options.languages, max_per_language=options.max_texts_per_language
    )
    train_books = set(parallel["groups"].get("bible", {}).get("train", []))
    trtd = [p for p in domains.get("bible", []) if p.group in train_books]
    multilingual = write_multilingual(out / "multilingual", out, texts, trtd)

    stage("tokenize")
    tokenized = _tokenize(out, options) if options.tokenize else {"skipped": "disabled"}

    stage("manifest")
    manifest = {
        "version": MANIFEST_VERSION,
        "nebula_mq": __version__,
        "fingerprint": fingerprint,
        "options": options.fingerprint_fields(),
        "packages": fetched,
        "inputs": {
            "catalogues": len(cats),
            "parallel": report.as_dict(),
            "multilingual": multilingual_report.as_dict(),
        },
        "parallel": {"pair": "es-en", **parallel},
        "multilingual": multilingual,
        "tokenized": tokenized,
    }
    _write_manifest(out, manifest)
    return manifest, True


def _tokenize(out: Path, options: BuildOptions) -> dict[str, Any]:
    """Tokenized parallel splits (XLM-R source, MiniLM target) and the source ids in use."""
    from nebula_mq.data.batches import tokenize_pairs, used_token_ids

    try:
        from nebula_mq.data.tokenizers import load_minilm_tokenizer, load_xlmr_tokenizer

        src_tok, tgt_tok = load_xlmr_tokenizer(), load_minilm_tokenizer()
    except (ImportError, OSError, DataError) as exc:
        log.warning("data.tokenize_skipped", why=str(exc))
        return {"skipped": f"tokenizers unavailable: {exc}"}
    import numpy as np

    files: dict[str, Any] = {}
    all_src: list[str] = []
    for split in SPLITS:
        rows = list(read_jsonl(out / "parallel" / f"{split}.jsonl"))
        src, tgt = [r["src"] for r in rows], [r["tgt"] for r in rows]
        all_src.extend(src)
        path = out / "tokenized" / f"{split}.npz"
        count = tokenize_pairs(src, tgt, src_tok, tgt_tok, path, max_len_src=options.max_len,
                               max_len_tgt=options.max_len, domains=[r.get("domain", "all") for r in rows])
        files[split] = {"path": str(path.relative_to(out)), "sha256": sha256_file(path), "rows": count}
    used = used_token_ids(src_tok, all_src)
    used_path = out / "tokenized" / "src_used_token_ids.npy"
    np.save(used_path, used)
    files["src_used_token_ids"] = {"path": str(used_path.relative_to(out)), "sha256": sha256_file(used_path), "rows": int(len(used))}
    return {"src_tokenizer": "xlm-r", "tgt_tokenizer": "minilm", "max_len": options.max_len, "files": files}


def _fingerprint(options: BuildOptions, cats: list[catalogues.Catalogue], fetched: dict[str, bool]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([MANIFEST_VERSION, __version__, options.fingerprint_fields(), fetched], sort_keys=True).encode())
    # The pipeline's own code: a changed cleaning rule invalidates an old build.
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    for c in cats:
        try:
            st = c.path.stat()
        except OSError:
            continue
        digest.update(f"{c.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def output_records(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every output file the manifest lists, as ``{"path", "sha256", "rows"}``."""
    records = list(manifest.get("parallel", {}).get("files", {}).values())
    multilingual = manifest.get("multilingual", {})
    records += list(multilingual.get("families", {}).values())
    if "trtd" in multilingual:
        records.append(multilingual["trtd"])
    records += list(manifest.get("tokenized", {}).get("files", {}).values())
    return records


def verify_outputs(out: Path, manifest: dict[str, Any]) -> bool:
    for record in output_records(manifest):
        path = out / record["path"]
        if not path.is_file() or sha256_file(path) != record["sha256"]:
            return False
    return True


def read_manifest(out: Path) -> dict[str, Any] | None:
    path = out / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("data.manifest_unreadable", path=str(path), why=str(exc))
        return None


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
