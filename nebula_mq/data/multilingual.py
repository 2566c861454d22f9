"""Multilingual text for pre-training, one file per language family.

Monolingual text is the translated side (msgstr) of every installed catalogue,
deduplicated per language. The Bible's es/en verse pairs from the *training*
books are added as parallel text for translation replaced-token detection
(TRTD), so held-out books stay unseen by pre-training too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nebula_mq.data import catalogues as cat
from nebula_mq.data.corpus_io import InputReport, write_jsonl
from nebula_mq.data.families import FAMILIES, family_of
from nebula_mq.data.parallel import ParallelPair

MIN_CHARS = 3


def collect_texts(
    catalogues: Iterable[cat.Catalogue],
    report: InputReport,
    *,
    languages: Iterable[str] | None = None,
    min_chars: int = MIN_CHARS,
    max_per_language: int | None = None,
) -> dict[str, list[str]]:
    """Language → unique cleaned msgstr texts, in sorted catalogue order.

    ``languages`` (ISO 639 codes) restricts the languages; English variants are
    skipped because their msgstr mostly repeats the msgid.
    """
    wanted = {lang.lower() for lang in languages} if languages is not None else None
    selected = [
        c
        for c in catalogues
        if (wanted is None or cat.language_of(c.locale) in wanted) and cat.language_of(c.locale) != "en"
    ]
    seen: dict[str, set[str]] = {}
    texts: dict[str, list[str]] = {}
    for catalogue, _english, translated in cat.iter_cleaned(selected, report):
        lang = cat.language_of(catalogue.locale)
        bucket = texts.setdefault(lang, [])
        if len(translated) < min_chars or (max_per_language is not None and len(bucket) >= max_per_language):
            continue
        known = seen.setdefault(lang, set())
        if translated not in known:
            known.add(translated)
            bucket.append(translated)
    return {lang: rows for lang, rows in sorted(texts.items()) if rows}


def write_multilingual(
    out_dir: Path, root: Path, texts: dict[str, list[str]], trtd: Sequence[ParallelPair]
) -> dict[str, Any]:
    """Write ``<family>.jsonl`` (``{"lang", "text"}``) and ``trtd_es_en.jsonl``; return the manifest section."""
    by_family: dict[str, list[str]] = {}
    for lang in texts:
        by_family.setdefault(family_of(lang), []).append(lang)
    families: dict[str, Any] = {}
    for family in FAMILIES:
        langs = sorted(by_family.get(family, []))
        if not langs:
            continue
        rows = ({"lang": lang, "text": t} for lang in langs for t in texts[lang])
        record = write_jsonl(out_dir / f"{family}.jsonl", rows, root=root)
        families[family] = {**record.as_dict(), "languages": {lang: len(texts[lang]) for lang in langs}}
    trtd_record = write_jsonl(
        out_dir / "trtd_es_en.jsonl",
        ({"src_lang": "es", "tgt_lang": "en", "src": p.src, "tgt": p.tgt, "group": p.group} for p in trtd),
        root=root,
    )
    return {"families": families, "trtd": trtd_record.as_dict(), "languages": len(texts)}
