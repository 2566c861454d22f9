"""The whole build on generated catalogues, and (slow) on this machine's real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data_catalogues import write_mo

from nebula_mq.cli import main
from nebula_mq.data.build import MANIFEST, BuildOptions, build, output_records, read_manifest
from nebula_mq.data.multilingual import family_of
from nebula_mq.data.parallel import SPLITS

WORDS = ["red", "green", "blue", "file", "folder", "window", "server", "disk", "user", "group", "key", "port"]
ES = {"red": "rojo", "green": "verde", "blue": "azul", "file": "archivo", "folder": "carpeta", "window": "ventana",
      "server": "servidor", "disk": "disco", "user": "usuario", "group": "grupo", "key": "clave", "port": "puerto"}  # fmt: skip


def _messages(catalogue: int, lang: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, a in enumerate(WORDS):
        b = WORDS[(i + catalogue) % len(WORDS)]
        english = f"Open the {a} {b} number {catalogue}"
        out[english] = f"{lang}: abrir {ES[a]} {ES[b]} número {catalogue}"
    out["Cannot open %s"] = "No se puede abrir %s"
    out["file\x00files"] = "archivo\x00archivos"
    return out


@pytest.fixture()
def locale_root(tmp_path: Path) -> Path:
    root = tmp_path / "locale"
    for n in range(12):
        write_mo(root / f"es/LC_MESSAGES/app{n:02d}.mo", _messages(n, "es"))
    for lang in ("fr", "de", "ru", "fi"):
        for n in range(2):
            write_mo(root / f"{lang}/LC_MESSAGES/app{n:02d}.mo", _messages(n, lang))
    (root / "es/LC_MESSAGES/broken.mo").write_bytes(b"\x95\x04\x12\xde" + b"\x00" * 10)
    (root / "es/LC_MESSAGES/empty.mo").write_bytes(b"")
    return root


def _options(out: Path, root: Path, **kw: object) -> BuildOptions:
    return BuildOptions(out=out, catalogue_roots=(str(root),), download=False, tokenize=False, **kw)  # type: ignore[arg-type]


def _rows(out: Path, split: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "parallel" / f"{split}.jsonl").read_text().splitlines()]


def test_build_writes_clean_leak_free_splits_and_a_manifest(tmp_path: Path, locale_root: Path) -> None:
    manifest, built = build(_options(tmp_path / "d", locale_root, seed=4))
    out = tmp_path / "d"
    assert built
    rows = {s: _rows(out, s) for s in SPLITS}
    assert sum(map(len, rows.values())) == 12 * len(WORDS)  # format strings and plurals dropped
    assert all(r["domain"] == "gettext" and r["src"].startswith("es: ") for s in SPLITS for r in rows[s])
    groups = {s: {r["group"] for r in rows[s]} for s in SPLITS}
    assert all(groups[s] for s in SPLITS)
    assert not (groups["train"] & groups["test"]) and not (groups["train"] & groups["valid"])
    assert manifest["parallel"]["counts"]["gettext"] == {s: len(rows[s]) for s in SPLITS}
    assert manifest["inputs"]["parallel"]["skipped_count"] == 2
    skipped = {Path(s["path"]).name for s in manifest["inputs"]["parallel"]["skipped"]}
    assert skipped == {"broken.mo", "empty.mo"}
    families = manifest["multilingual"]["families"]
    assert set(families) == {"romance", "germanic", "slavic", "uralic"}
    assert families["romance"]["languages"] == {"es": 12 * len(WORDS), "fr": 2 * len(WORDS)}
    assert families["uralic"]["languages"] == {"fi": 2 * len(WORDS)}
    assert json.loads((out / MANIFEST).read_text()) == manifest


def test_same_seed_same_bytes_other_seed_other_split(tmp_path: Path, locale_root: Path) -> None:
    a, _ = build(_options(tmp_path / "a", locale_root, seed=1))
    b, _ = build(_options(tmp_path / "b", locale_root, seed=1))
    c, _ = build(_options(tmp_path / "c", locale_root, seed=2))
    digests = lambda m: [r["sha256"] for r in output_records(m)]  # noqa: E731
    assert digests(a) == digests(b)
    assert a["parallel"]["groups"] != c["parallel"]["groups"]


def test_rebuild_is_skipped_until_inputs_or_outputs_change(tmp_path: Path, locale_root: Path) -> None:
    options = _options(tmp_path / "d", locale_root)
    first, built = build(options)
    assert built
    again, built = build(options)
    assert not built and again == first
    (tmp_path / "d" / "parallel" / "test.jsonl").write_text("tampered\n")
    _, built = build(options)
    assert built
    write_mo(locale_root / "it/LC_MESSAGES/new.mo", _messages(3, "it"))
    manifest, built = build(options)
    assert built and "it" in manifest["multilingual"]["families"]["romance"]["languages"]


def test_max_pairs_and_languages_options(tmp_path: Path, locale_root: Path) -> None:
    manifest, _ = build(_options(tmp_path / "d", locale_root, max_pairs=50, languages=("fi", "ru")))
    assert sum(manifest["parallel"]["counts"]["gettext"].values()) <= 50
    assert set(manifest["multilingual"]["families"]) == {"slavic", "uralic"}


def test_family_table() -> None:
    assert [family_of(x) for x in ("es", "de", "ru", "hi", "fi", "tr", "zh", "ka", "eu", "ta", "xx")] == [
        "romance", "germanic", "slavic", "indic", "uralic", "turkic", "cjk", "kartvelian", "basque", "dravidian", "other",
    ]  # fmt: skip


def test_stats_without_a_build_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "stats", "--out", str(tmp_path / "none")]) == 1
    assert "no manifest" in capsys.readouterr().err


@pytest.mark.slow
def test_real_build_on_installed_catalogues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "data"
    assert main(["data", "build", "--out", str(out), "--no-download", "--max-pairs", "2000"]) == 0
    printed = capsys.readouterr().out
    assert "gettext" in printed and "romance" in printed
    manifest = read_manifest(out)
    assert manifest is not None
    gettext = manifest["parallel"]["counts"]["gettext"]
    assert 1000 < sum(gettext.values()) <= 2000 and all(gettext[s] > 0 for s in SPLITS)
    families = manifest["multilingual"]["families"]
    assert manifest["multilingual"]["languages"] > 50
    assert {"romance", "germanic", "slavic", "cjk", "indic"} <= set(families)
    assert families["romance"]["languages"]["es"] > 5000
    tokenized = manifest["tokenized"]
    assert tokenized["files"]["train"]["rows"] == gettext["train"]
    assert main(["data", "stats", "--out", str(out)]) == 0
    assert "gettext" in capsys.readouterr().out


def test_multilingual_texts_are_deduplicated_per_language(tmp_path: Path) -> None:
    from nebula_mq.data.catalogues import discover
    from nebula_mq.data.corpus_io import InputReport
    from nebula_mq.data.multilingual import collect_texts

    root = tmp_path / "locale"
    write_mo(root / "pt/LC_MESSAGES/a.mo", {"Open": "Abrir", "Close": "Fechar", "Go": "Ir"})
    write_mo(root / "pt_BR/LC_MESSAGES/b.mo", {"Open file": "Abrir", "Save": "Salvar"})
    write_mo(root / "en_GB/LC_MESSAGES/a.mo", {"Color": "Colour"})
    texts = collect_texts(discover([str(root)]), InputReport(), min_chars=3)
    # Catalogue order is msgid order ("Close" < "Open"); "Ir" is too short; English is skipped.
    assert texts == {"pt": ["Fechar", "Abrir", "Salvar"]}
    capped = collect_texts(discover([str(root)]), InputReport(), max_per_language=2)
    assert capped == {"pt": ["Fechar", "Abrir"]}


@pytest.mark.slow
def test_real_bible_modules_align(tmp_path: Path) -> None:
    from nebula_mq.data import bible, debian

    status = debian.fetch(list(bible.PACKAGES), tmp_path / "cache")
    if not all(status.values()):
        pytest.skip(f"sword-text packages not downloadable here: {status}")
    pairs = bible.load_pairs(debian.unpacked_root(tmp_path / "cache"))
    assert 30_000 < len(pairs) < 31_200
    by_ref = {(p.book, p.chapter, p.verse): p for p in pairs}
    genesis = by_ref[("Gen", 1, 1)]
    assert genesis.es == "En el principio crió Dios los cielos y la tierra."
    assert genesis.en == "In the beginning, God created the heavens and the earth."
    assert by_ref[("Ps", 23, 1)].en.startswith("A Psalm by David. Yahweh is my shepherd")
    assert not any("<" in p.es + p.en or " fué " in p.es or "“" in p.en for p in pairs)
    assert len(by_ref[("Rev", 22, 21)].en) < 100  # the WEB glossary is not part of the verse
