"""Multilingual text for pre-training, one file per language family.

Monolingual text is the translated side (msgstr) of every installed catalogue,
deduplicated per language. The Bible's es/en verse pairs from the *training*
books are added as parallel text for translation replaced-token detection
(TRTD), so held-out books stay unseen by pre-training too.

Language families are the grouping behind one generator per language group (M3 in the
paper). Their keys are ISO 639 codes as they appear in locale names (``pt`` of ``pt_BR``);
a code missing there goes to :data:`OTHER`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nebula_mq.data import catalogues as cat
from nebula_mq.data.corpus_io import InputReport, write_jsonl
from nebula_mq.data.parallel import ParallelPair

MIN_CHARS = 3

OTHER = "other"

_FAMILIES: dict[str, tuple[str, ...]] = {
    "romance": ("an", "ast", "ca", "es", "fr", "frp", "fur", "gl", "it", "mo", "oc", "pt", "ro", "sc", "wa"),
    "germanic": ("af", "ang", "bar", "da", "de", "en", "fo", "fy", "is", "li", "nb", "nds", "nl", "nn", "no", "sv", "yi"),
    "slavic": ("be", "bg", "bs", "cs", "csb", "hr", "mk", "pl", "ru", "sk", "sl", "sr", "uk"),
    "baltic": ("lt", "lv"),
    "celtic": ("br", "cy", "ga", "gd", "gv", "kw"),
    "hellenic": ("el",),
    "albanian": ("sq",),
    "armenian": ("hy",),
    "indic": ("as", "bn", "dv", "gu", "hi", "kok", "mai", "mr", "ne", "or", "pa", "pi", "rom", "sd", "si", "ur"),
    "iranian": ("ckb", "fa", "kmr", "ku", "ps", "tg"),
    "uralic": ("et", "fi", "hu", "kv", "mhr"),
    "turkic": ("az", "ba", "crh", "cv", "kk", "ky", "tk", "tr", "tt", "ug", "uz"),
    "mongolic": ("mn",),
    "cjk": ("ja", "ko", "zh"),
    "sino_tibetan": ("dz", "my"),
    "austroasiatic": ("km", "vi"),
    "tai": ("lo", "th"),
    "austronesian": ("ace", "ch", "fil", "haw", "id", "mg", "mi", "ms", "na", "tl"),
    "semitic": ("am", "ar", "gez", "he", "mt", "ti", "tig"),
    "afroasiatic": ("byn", "ha", "kab", "so", "tzm", "wal"),
    "kartvelian": ("ka",),
    "basque": ("eu",),
    "dravidian": ("kn", "ml", "ta", "te"),
    "niger_congo": ("ak", "ee", "ff", "ki", "lg", "nso", "rw", "sw", "ve", "wo", "xh", "yo", "zu"),
    "nilo_saharan": ("ach", "son"),
    "caucasian": ("ab", "ce"),
    "americas": ("ay", "chr", "gn", "iu", "kl", "nah", "nv", "qu"),
    "constructed": ("eo", "ia", "ie", "io"),
    "creole": ("bi", "ht", "jam", "pap"),
    "isolate": ("ain",),
}

FAMILY_OF: dict[str, str] = {code: family for family, codes in _FAMILIES.items() for code in codes}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES) + (OTHER,)


def family_of(language: str) -> str:
    """Family of an ISO 639 code (``"es"`` → ``"romance"``); unknown codes → ``"other"``."""
    return FAMILY_OF.get(language.lower(), OTHER)


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
