"""gettext catalogues: real .mo files written here, read by the standard library."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_mq.data import catalogues as cat
from nebula_mq.data.corpus_io import InputReport
from nebula_mq.errors import DataError

HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=n != 1;\n"


def write_mo(path: Path, messages: dict[str, str], *, header: str | None = HEADER) -> Path:
    """Write a GNU .mo file (the documented format: magic, two string tables, no hash table).

    Keys may carry a context ("ctx\\x04msgid") or plural forms ("one\\x00many").
    """
    entries = dict(messages)
    if header is not None:
        entries[""] = header
    keys = sorted(entries, key=lambda k: k.encode("utf-8"))
    ids = [k.encode("utf-8") for k in keys]
    strs = [entries[k].encode("utf-8") for k in keys]
    n = len(keys)
    key_table = 28
    value_table = key_table + 8 * n
    data_start = value_table + 8 * n
    blob = b""
    key_index: list[tuple[int, int]] = []
    value_index: list[tuple[int, int]] = []
    for raw in ids:
        key_index.append((len(raw), data_start + len(blob)))
        blob += raw + b"\0"
    for raw in strs:
        value_index.append((len(raw), data_start + len(blob)))
        blob += raw + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, n, key_table, value_table, 0, 0)
    out += b"".join(struct.pack("<2I", *e) for e in key_index)
    out += b"".join(struct.pack("<2I", *e) for e in value_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out + blob)
    return path


def test_written_catalogue_reads_back_through_gettext(tmp_path: Path) -> None:
    path = write_mo(tmp_path / "x.mo", {"Open file": "Abrir archivo", "one\x00many": "uno\x00muchos"})
    catalog = cat.read_catalogue(path)
    assert catalog["Open file"] == "Abrir archivo"
    assert catalog[("one", 1)] == "muchos"


def test_cleaning_rules(tmp_path: Path) -> None:
    messages = {
        "Open file": "Abrir archivo",
        "_Save As": "Guardar _como",
        "&Quit": "&Salir",
        "menu\x04_Edit": "_Editar",
        "Salt && Pepper": "Sal && Pimienta",
        "%d file\x00%d files": "%d archivo\x00%d archivos",
        "Cannot open %s": "No se puede abrir %s",
        "Deleted %1$s of %2$s": "Borrados %1$s de %2$s",
        "Hello {name}": "Hola {name}",
        "Set $HOME first": "Defina $HOME primero",
        "Use ${PATH}": "Use ${PATH}",
        "%B: bad reloc": "%B: reubicación errónea",
        "<b>Bold</b>": "<b>Negrita</b>",
        "OK": "OK",
        "x": "y",
        "A" * 301: "B" * 301,
        "L" * 300: "M" * 300,
        "Two\n  lines": "Dos\n  líneas",
    }
    pairs = dict(cat.message_pairs(cat.read_catalogue(write_mo(tmp_path / "c.mo", messages))))
    assert pairs == {
        "Open file": "Abrir archivo",
        "Save As": "Guardar como",
        "Quit": "Salir",
        "Edit": "Editar",
        "Salt & Pepper": "Sal & Pimienta",
        "L" * 300: "M" * 300,
        "Two lines": "Dos líneas",
    }


@pytest.mark.parametrize(
    "text",
    ["%s", "%5.2f%%", "%(name)s", "%1$d", "%lu", "{0}", "{x}", "$VAR", "${VAR}", "$(VAR)", "%1", "%PRODUCTNAME"],
)
def test_format_codes_are_detected(text: str) -> None:
    assert cat.has_format_code(f"before {text} after")


@pytest.mark.parametrize("text", ["100% sure", "Save as…", "a {b c}", "Price: 5 $", "Q&A"])
def test_plain_text_is_not_a_format_code(text: str) -> None:
    assert not cat.has_format_code(text)


@given(st.text(max_size=400))
def test_clean_text_output_obeys_the_rules(text: str) -> None:
    out = cat.clean_text(text)
    if out is not None:
        assert cat.MIN_CHARS <= len(out) <= cat.MAX_CHARS
        assert out == out.strip() and "  " not in out
        assert not cat.has_format_code(out)


@given(st.text(min_size=1, max_size=40), st.sampled_from(["%s", "%d", "{x}", "$VAR"]))
def test_text_with_a_format_code_is_always_dropped(text: str, code: str) -> None:
    assert cat.clean_text(f"{text} {code} {text}") is None


def test_corrupt_and_empty_files_raise_data_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.mo"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.mo"
    garbage.write_bytes(b"this is not a catalogue at all, just text" * 3)
    good = write_mo(tmp_path / "good.mo", {"Open": "Abrir"}).read_bytes()
    truncated = tmp_path / "truncated.mo"
    truncated.write_bytes(good[:40])
    for path in (empty, garbage, truncated, tmp_path / "missing.mo"):
        with pytest.raises(DataError, match=path.name):
            cat.read_catalogue(path)


def test_iter_cleaned_reports_bad_files_and_keeps_going(tmp_path: Path) -> None:
    root = tmp_path / "locale"
    write_mo(root / "es/LC_MESSAGES/a.mo", {"Open": "Abrir"})
    (root / "es/LC_MESSAGES/b.mo").write_bytes(b"\xde\x12\x04\x95" + b"\xff" * 40)
    (root / "es/LC_MESSAGES/c.mo").write_bytes(b"")
    write_mo(root / "es/LC_MESSAGES/d.mo", {})  # header only: an empty catalogue
    write_mo(root / "es/LC_MESSAGES/e.mo", {"Close": "Cerrar"})
    report = InputReport()
    found = [(c.name, en, es) for c, en, es in cat.iter_cleaned(cat.discover([str(root)]), report)]
    assert found == [("a", "Open", "Abrir"), ("e", "Close", "Cerrar")]
    assert report.read == 2
    assert sorted(Path(s["path"]).name for s in report.skipped) == ["b.mo", "c.mo", "d.mo"]


def test_discover_prefers_the_plain_locale_over_charset_variants(tmp_path: Path) -> None:
    root = tmp_path / "lang"
    write_mo(root / "pl.cp1250/LC_MESSAGES/vim.mo", {"a b": "c d"})
    write_mo(root / "pl/LC_MESSAGES/vim.mo", {"a b": "c d"})
    write_mo(root / "pl.UTF-8/LC_MESSAGES/vim.mo", {"a b": "c d"})
    write_mo(root / "pt_BR/LC_MESSAGES/vim.mo", {"a b": "c d"})
    found = cat.discover([str(root)], prefix="vim/")
    assert [(c.locale, c.name, c.path.parent.parent.name) for c in found] == [
        ("pl", "vim/vim", "pl"),
        ("pt_BR", "vim/vim", "pt_BR"),
    ]
    assert cat.discover([str(root)], locales=["pt_BR"])[0].locale == "pt_BR"


@pytest.mark.parametrize(("locale", "lang"), [("pt_BR", "pt"), ("sr@latin", "sr"), ("zh_CN", "zh"), ("es", "es")])
def test_language_of_locale(locale: str, lang: str) -> None:
    assert cat.language_of(locale) == lang
