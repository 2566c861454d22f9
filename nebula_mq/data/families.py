"""Language families: the grouping behind one generator per language group (M3 in the paper).

Keys are ISO 639 codes as they appear in locale names (``pt`` of ``pt_BR``).
A code missing here goes to :data:`OTHER`.
"""

from __future__ import annotations

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
