"""Verse-aligned Spanish/English Bible: Reina-Valera 1909 against the World English Bible.

Both are public-domain SWORD modules packaged by Debian (``sword-text-sparv``,
``sword-text-web``) and read with ``pysword``. Each module is read with the
versification its ``.conf`` declares (the WEB uses NRSVA, which numbers 3 John
and Revelation 12 differently from KJV), and verses are joined on
(book, chapter, verse) rather than on file position, so one versification
difference cannot shift every later verse.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from nebula_mq.errors import DataError

log = structlog.get_logger(__name__)

PACKAGES = ("sword-text-sparv", "sword-text-web")
SPANISH_MODULE = "spaRV1909eb"
ENGLISH_MODULE = "engWEB2015eb"

VerseKey = tuple[str, int, int]  # (OSIS book name, chapter, verse)


@dataclass(frozen=True)
class VersePair:
    book: str  # OSIS name, e.g. "Gen"; the unit of the train/test split
    chapter: int
    verse: int
    es: str
    en: str


# --------------------------------------------------------------------------- markup

# Whatever follows the end-of-chapter marker is not verse text (the WEB appends its
# glossary to Revelation 22:21).
_CHAPTER_END = re.compile(r"<chapter\b[^>]*\beID=")
_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.S)
_CANONICAL_TITLE = re.compile(r"<title\b[^>]*canonical=\"true\"[^>]*>(.*?)</title>", re.S)
_OTHER_TITLE = re.compile(r"<title\b[^>]*>.*?</title>", re.S)
# Tags that separate words (lines, paragraphs, milestones) become a space; inline
# tags (<w>, <q>, <transChange>) vanish, since the text around them carries its own spaces.
_BLOCK_TAG = re.compile(r"</?(?:l|lg|p|div|lb|br|chapter|milestone|verse|title)\b[^>]*>")
_ANY_TAG = re.compile(r"<[^>]*>")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)\]»”’])")
_SPACE_AFTER_OPEN = re.compile(r"([(\[¿¡«“])\s+")
_QUOTES = str.maketrans({"“": '"', "”": '"', "„": '"', "«": '"', "»": '"', "‘": "'", "’": "'"})


def strip_markup(raw: str) -> tuple[str, str]:
    """(canonical title, verse text) of one OSIS verse, both without markup."""
    end = _CHAPTER_END.search(raw)
    if end is not None:
        raw = raw[: end.start()]
    titles = [_ANY_TAG.sub("", t) for t in _CANONICAL_TITLE.findall(raw)]
    text = _NOTE.sub(" ", raw)
    text = _CANONICAL_TITLE.sub(" ", text)
    text = _OTHER_TITLE.sub(" ", text)
    text = _BLOCK_TAG.sub(" ", text)
    text = _ANY_TAG.sub("", text)
    return _tidy(" ".join(titles)), _tidy(text)


def _tidy(text: str) -> str:
    text = " ".join(text.split())
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    text = _SPACE_AFTER_OPEN.sub(r"\1", text)
    return text.translate(_QUOTES)


# --------------------------------------------------------------------------- spelling

# Reina-Valera 1909 keeps accents the 1952 orthography dropped: the preposition "á",
# the conjunctions "ó"/"é", and monosyllabic preterites ("fué", "dió", "vió").
_OLD_SPELLING = {
    "á": "a", "ó": "o", "é": "e",
    "fué": "fue", "fuí": "fui", "dió": "dio", "vió": "vio", "dí": "di",
    "pié": "pie", "piés": "pies", "rió": "rio", "guió": "guio", "fió": "fio",
}  # fmt: skip
_WORD = re.compile(r"\w+")
_ALL_CAPS = re.compile(r"\b[^\W\d_]{2,}\b")


def _respell(match: re.Match[str]) -> str:
    word = match.group(0)
    modern = _OLD_SPELLING.get(word.lower())
    if modern is None:
        return word
    return modern.capitalize() if word[0].isupper() else modern


def modernise_spanish(text: str) -> str:
    """Replace pre-1952 accents by the modern spelling (``fué`` → ``fue``, ``á`` → ``a``)."""
    return _WORD.sub(_respell, text)


def decapitalise_opening(text: str, casing: Mapping[str, str] | None = None) -> str:
    """Undo the all-caps first word that opens a chapter (``EN el principio`` → ``En el principio``).

    At the start of a sentence the word is capitalised; inside one (``Y COMO fueron``)
    it takes the case ``casing`` records for it elsewhere in the text (``como``, but
    ``Jehová``), capitalised when unknown.
    """
    for match in _ALL_CAPS.finditer(text):
        word = match.group(0)
        if not word.isupper():
            continue
        before = text[: match.start()].rstrip(" ¡¿\"'(")
        if not before or before[-1] in ".!?:":
            fixed = word.capitalize()
        else:
            fixed = (casing or {}).get(word.lower(), word.capitalize())
        return text[: match.start()] + fixed + text[match.end() :]
    return text


def word_casing(texts: Iterable[str]) -> dict[str, str]:
    """lowercase word → its more frequent form in ``texts``: lowercase or Capitalised."""
    counts: Counter[str] = Counter(_WORD.findall(" ".join(texts)))
    out: dict[str, str] = {}
    for word in counts:
        lower = word.lower()
        if lower not in out:
            out[lower] = lower if counts[lower] >= counts[lower.capitalize()] else lower.capitalize()
    return out


def clean_verse(raw: str, *, chapter_start: bool, spanish: bool, casing: Mapping[str, str] | None = None) -> str:
    """A verse ready for the corpus: markup gone, a Psalm title folded into the verse."""
    title, text = strip_markup(raw)
    if chapter_start:
        text = decapitalise_opening(text, casing)
    if title:
        text = f"{title} {text}".strip()
    if spanish:
        text = modernise_spanish(text)
    return text


# --------------------------------------------------------------------------- modules


def _conf(root: Path, module: str) -> dict[str, str]:
    mods = root / "usr/share/sword/mods.d"
    conf = mods / f"{module}.conf"
    if not conf.exists():
        conf = mods / f"{module.lower()}.conf"
    try:
        lines = conf.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        raise DataError(f"{conf}: configuration of SWORD module {module} missing") from None
    out: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out.setdefault(key.strip(), value.strip())
    return out


def read_module(root: Path, module: str, *, spanish: bool) -> dict[VerseKey, str]:
    """Every non-empty verse of one unpacked SWORD module, cleaned, keyed by reference."""
    from pysword.bible import SwordBible  # the reader of a third-party format: import lazily

    conf = _conf(root, module)
    path = root / "usr/share/sword" / conf.get("DataPath", f"modules/texts/ztext/{module.lower()}/")
    versification = conf.get("Versification", "KJV").lower()
    try:
        bible = SwordBible(str(path), module_type="ztext", versification=versification)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"{path}: cannot open SWORD module {module}: {exc}") from None
    # pysword decompresses a whole book for every verse it returns; caching the last
    # few decompressed blocks makes a full read take seconds instead of a minute.
    bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
    raws = list(_iter_raw(bible))
    # How words are cased inside chapters decides how a chapter's all-caps opening is undone.
    casing = word_casing(strip_markup(raw)[1] for key, raw in raws if key[2] != 1)
    verses: dict[VerseKey, str] = {}
    for key, raw in raws:
        text = clean_verse(raw, chapter_start=key[2] == 1, spanish=spanish, casing=casing)
        if text:
            verses[key] = text
    if not verses:
        raise DataError(f"{path}: SWORD module {module} has no verses")
    return verses


def _iter_raw(bible: object) -> Iterator[tuple[VerseKey, str]]:
    structure = bible.get_structure()  # type: ignore[attr-defined]
    for books in structure.get_books().values():
        for book in books:
            for chapter, n_verses in enumerate(book.chapter_lengths, start=1):
                try:
                    texts = list(bible.get_iter(books=[book.name], chapters=[chapter], clean=False))  # type: ignore[attr-defined]
                except (OSError, ValueError, IndexError, UnicodeError) as exc:
                    log.warning("data.bible_chapter_unreadable", book=book.osis_name, chapter=chapter, why=str(exc))
                    continue
                # A zText module yields exactly one (possibly empty) text per verse.
                for verse, raw in zip(range(1, n_verses + 1), texts):
                    yield (book.osis_name, chapter, verse), raw


# A verse whose two sides differ in length beyond this ratio is misaligned (a verse
# merged into its neighbour by one versification), not a translation.
MAX_LENGTH_RATIO = 3.0


def align(es: dict[VerseKey, str], en: dict[VerseKey, str]) -> list[VersePair]:
    """Verse pairs present in both translations, in canonical order of the Spanish text."""
    pairs = []
    for key, text in es.items():
        other = en.get(key)
        if other is None:
            continue
        short, long = sorted((len(text), len(other)))
        if long > MAX_LENGTH_RATIO * max(short, 10):
            continue
        pairs.append(VersePair(key[0], key[1], key[2], text, other))
    return pairs


def load_pairs(root: Path) -> list[VersePair]:
    """Aligned pairs from the modules unpacked under ``root``."""
    es = read_module(root, SPANISH_MODULE, spanish=True)
    en = read_module(root, ENGLISH_MODULE, spanish=False)
    return align(es, en)
