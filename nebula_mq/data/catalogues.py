"""gettext catalogues: find them, read them, clean their message pairs.

The cleaning rules are the ones the corpus notes give (``shared/DATA.md``):
plural entries are dropped, the ``msgctxt`` prefix of a context key is removed
(LibreOffice keys nearly every message by context, so dropping those entries
would drop LibreOffice entirely), identical pairs and strings with format codes
are dropped, menu accelerators are stripped, and only strings of 2..300
characters are kept.
"""

from __future__ import annotations

import gettext
import glob
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nebula_mq.data.corpus_io import InputReport
from nebula_mq.errors import DataError

MIN_CHARS = 2
MAX_CHARS = 300

# Places Debian and Ubuntu install catalogues; each holds <locale>/LC_MESSAGES/*.mo.
DEFAULT_ROOTS: tuple[str, ...] = (
    "/usr/share/locale",
    "/usr/share/locale-langpack",
    "/usr/lib/*/locale",
    "/usr/share/vim/vim*/lang",
)

# printf (%s, %-5.2f, %1$s, %(name)s, %%-free), Qt/LO numbered (%1) and named (%PRODUCTNAME),
# brace (Python/C#/ICU {0} {name}), shell ($VAR, ${VAR}, $(VAR)), and LO's $name$ codes.
_FORMAT_CODE = re.compile(
    r"%(?:\d+\$)?(?:\([^)]*\))?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|Z|t|I64|I32|I)?[diouxXeEfFgGaAcspnmCS]"
    r"|%\d+|%[A-Z][A-Z_]*"
    r"|\{[^{}\s]*\}"
    r"|\$\{?\(?[A-Za-z_][A-Za-z0-9_]*"
    r"|<[^<>]*>"  # markup (gtk, LibreOffice help): not plain sentences
)
# An accelerator marker immediately before the letter it underlines. "&&" and "__"
# are escaped literals; an HTML entity (&amp;) is not a marker.
_MARKER = re.compile(r"(?<![_&~])[_&~](?=[^\W_])(?![A-Za-z]+;)")
_SPACES = re.compile(r"\s+")
_CONTEXT_SEPARATOR = "\x04"
_MO_MAGICS = (0x950412DE, 0xDE120495)


@dataclass(frozen=True)
class Catalogue:
    """One installed ``.mo`` file."""

    path: Path
    # Locale directory name with any ".charset" suffix removed, e.g. "pt_BR", "sr@latin".
    locale: str
    # Catalogue name used to split by source: the file stem, prefixed by its origin
    # when it is not a system catalogue (e.g. "libreoffice/svx").
    name: str


def language_of(locale: str) -> str:
    """ISO 639 language code of a locale name: ``pt_BR`` → ``pt``, ``sr@latin`` → ``sr``."""
    return re.split(r"[_@.]", locale, maxsplit=1)[0].lower()


def discover(
    roots: Iterable[str] = DEFAULT_ROOTS, *, prefix: str = "", locales: Iterable[str] | None = None
) -> list[Catalogue]:
    """All ``<root>/<locale>/LC_MESSAGES/*.mo`` files, sorted, one per (locale, name).

    Roots are glob patterns. When the same catalogue appears under several charset
    variants of a locale (vim ships ``pl``, ``pl.UTF-8`` and ``pl.cp1250``) the
    variant without a charset suffix wins. ``locales`` keeps only those locales.
    """
    wanted = set(locales) if locales is not None else None
    found: dict[tuple[str, str], tuple[int, Catalogue]] = {}
    for pattern in roots:
        for root in sorted(glob.glob(pattern)):
            for mo in sorted(glob.glob(os.path.join(root, "*", "LC_MESSAGES", "*.mo"))):
                path = Path(mo)
                locale_dir = path.parent.parent.name
                locale = locale_dir.split(".", 1)[0]
                if wanted is not None and locale not in wanted:
                    continue
                name = prefix + path.stem
                rank = 0 if locale_dir == locale else (1 if locale_dir.lower().endswith("utf-8") else 2)
                key = (locale, name)
                if key not in found or rank < found[key][0]:
                    found[key] = (rank, Catalogue(path=path, locale=locale, name=name))
    return sorted((c for _, c in found.values()), key=lambda c: (c.locale, c.name, str(c.path)))


def read_catalogue(path: Path) -> dict[object, str]:
    """msgid → msgstr of one ``.mo`` file, as the standard library reads it.

    Raises :class:`DataError` for a missing, empty, truncated or otherwise corrupt file.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read catalogue: {exc.strerror}") from None
    if len(data) < 28:
        raise DataError(f"{path}: empty or truncated catalogue ({len(data)} bytes)")
    if struct.unpack("<I", data[:4])[0] not in _MO_MAGICS:
        raise DataError(f"{path}: not a gettext .mo file (bad magic number)")
    try:
        with path.open("rb") as fh:
            return dict(gettext.GNUTranslations(fh)._catalog)  # type: ignore[attr-defined]
    except (OSError, ValueError, LookupError, struct.error, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: corrupt catalogue: {exc}") from None


def strip_menu_markers(text: str) -> str:
    """Remove accelerator markers (``_File``, ``&Open``, ``~Save``); keep ``&&``/``__`` as one."""
    text = _MARKER.sub("", text)
    return text.replace("&&", "&").replace("__", "_")


def has_format_code(text: str) -> bool:
    return _FORMAT_CODE.search(text) is not None


def clean_text(text: str) -> str | None:
    """One message cleaned, or ``None`` when the rules drop it."""
    # Checked after the menu markers go: a marker can hide a format code ("%_0" -> "%0").
    text = _SPACES.sub(" ", strip_menu_markers(text)).strip()
    if has_format_code(text) or not MIN_CHARS <= len(text) <= MAX_CHARS:
        return None
    return text


def message_pairs(catalog: dict[object, str]) -> Iterator[tuple[str, str]]:
    """Cleaned (msgid, msgstr) pairs of one catalogue, in file order.

    The header (empty msgid), plural entries (tuple keys), untranslated and identical
    pairs are dropped; a context key keeps its msgid without the context.
    """
    for key, value in catalog.items():
        if not isinstance(key, str) or not key or not value:
            continue
        msgid = key.split(_CONTEXT_SEPARATOR, 1)[1] if _CONTEXT_SEPARATOR in key else key
        english, translated = clean_text(msgid), clean_text(value)
        if english is None or translated is None or english == translated:
            continue
        yield english, translated


def iter_cleaned(catalogues: Iterable[Catalogue], report: InputReport) -> Iterator[tuple[Catalogue, str, str]]:
    """(catalogue, english, translated) for every cleaned pair; bad files go to ``report``."""
    for catalogue in catalogues:
        try:
            catalog = read_catalogue(catalogue.path)
        except DataError as exc:
            report.skip(catalogue.path, str(exc))
            continue
        if not any(isinstance(k, tuple) or k for k in catalog):
            report.skip(catalogue.path, "empty catalogue (no messages)")
            continue
        report.read += 1
        for english, translated in message_pairs(catalog):
            yield catalogue, english, translated
