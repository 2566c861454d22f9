"""Bible cleanup and alignment, on verse texts shaped like the SWORD modules' OSIS."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.data import bible
from nebula_mq.errors import DataError

WEB_PSALM = (
    '<div type="x-milestone" subType="x-preverse" sID="pv1"/><title canonical="true" type="psalm">'
    "A Psalm by David.</title> <lg sID=\"g1\"/> <l level=\"1\" sID=\"g2\"/><w lemma=\"strong:H3068\">Yahweh</w> "
    '<w lemma="strong:H3068">is</w> my shepherd;<l eID="g2" level="1"/> <l level="2" sID="g3"/>'
    "I shall lack nothing. <l eID=\"g3\" level=\"2\"/>"
)
WEB_NOTE = (
    '<w lemma="strong:H0430">In</w> the beginning, <w>God</w><note placement="foot"><reference>1:1 </reference>'
    "The Hebrew word rendered “God” is “אֱלֹהִ֑ים”.</note><w>created</w> the heavens ‘and’ the earth."
)
WEB_LAST = 'Amen.  <chapter eID="Rev.22"/><div type="glossary"/> The following words used in the World English Bible'


def test_markup_notes_and_quotes_are_removed() -> None:
    assert bible.strip_markup(WEB_NOTE) == ("", "In the beginning, God created the heavens 'and' the earth.")


def test_text_after_the_chapter_end_is_dropped() -> None:
    assert bible.strip_markup(WEB_LAST) == ("", "Amen.")


def test_psalm_title_is_folded_into_verse_one() -> None:
    verse = bible.clean_verse(WEB_PSALM, chapter_start=True, spanish=False)
    assert verse == "A Psalm by David. Yahweh is my shepherd; I shall lack nothing."


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Y fué la luz; y dió á su hijo ó á su hija", "Y fue la luz; y dio a su hijo o a su hija"),
        ("Á los que vió, fuí", "A los que vio, fui"),
        ("Él está aquí; tú sé fiel", "Él está aquí; tú sé fiel"),  # modern accents stay
    ],
)
def test_old_spanish_spelling_is_modernised(old: str, new: str) -> None:
    assert bible.modernise_spanish(old) == new


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("EN el principio crió Dios", "En el principio crió Dios"),
        ("Salmo de David. JEHOVÁ es mi pastor", "Salmo de David. Jehová es mi pastor"),
        ("¡OH Jehová, cuánto", "¡Oh Jehová, cuánto"),
        ("I am the LORD", "I am the Lord"),
        ("Y dijo Dios", "Y dijo Dios"),
    ],
)
def test_all_caps_chapter_opening_is_decapitalised(text: str, expected: str) -> None:
    assert bible.decapitalise_opening(text) == expected


def test_spanish_verse_one_gets_every_cleanup() -> None:
    raw = '<w lemma="strong:H7225">EN el principio</w> <w>crió</w> Dios á los cielos. '
    assert bible.clean_verse(raw, chapter_start=True, spanish=True) == "En el principio crió Dios a los cielos."
    assert bible.clean_verse(raw, chapter_start=False, spanish=True).startswith("EN el")


def test_align_joins_on_reference_and_drops_misaligned_lengths() -> None:
    es = {("Gen", 1, 1): "En el principio", ("Gen", 1, 2): "Y la tierra", ("3John", 1, 14): "corto"}
    en = {("Gen", 1, 1): "In the beginning", ("Gen", 1, 3): "God said", ("3John", 1, 14): "x" * 200}
    assert bible.align(es, en) == [bible.VersePair("Gen", 1, 1, "En el principio", "In the beginning")]


def test_missing_module_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="spaRV1909eb"):
        bible.read_module(tmp_path, bible.SPANISH_MODULE, spanish=True)


def test_caps_inside_a_sentence_take_the_case_used_elsewhere() -> None:
    casing = bible.word_casing(["y como dijo Jehová", "Como Jehová quiso, como siempre"])
    assert casing["como"] == "como" and casing["jehová"] == "Jehová"
    assert bible.decapitalise_opening("Y COMO fueron cerca", casing) == "Y como fueron cerca"
    assert bible.decapitalise_opening("Y JEHOVÁ habló", casing) == "Y Jehová habló"
    assert bible.decapitalise_opening("Salmo de David. COMO el ciervo", casing) == "Salmo de David. Como el ciervo"
