"""Zonos phonemisation: text -> espeak-ng phonemes (through `phonemizer`) -> the checkpoint's symbol ids.

As the reference: numbers, currency, ordinals and decimals are spelled out in English words first, for
every language (the reference does so for all but Japanese, which it reads through sudachipy; Japanese is
refused here for that reason); espeak-ng then phonemises with stress marks and punctuation kept; each
character maps to its symbol id (unknown ones to UNK) between BOS and EOS. `phonemizer` and the
espeak-ng library are imported on first use, so the rest of the package works without them.

The symbol table and the language list are the checkpoint's vocabulary: their order defines the ids.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

PHONEME_PAD_ID, PHONEME_UNK_ID, PHONEME_BOS_ID, PHONEME_EOS_ID = 0, 1, 2, 3
NUM_SPECIAL_IDS = 4
PUNCTUATION = ';:,.!?¡¿—…"«»“”() *~-/\\&'
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
IPA_LETTERS = (
    "ɑɐɒæɓʙβɔɕçɗɖðʤəɘɚɛɜɝɞɟʄɡɠɢʛɦɧħɥʜɨɪʝɭɬɫɮʟɱɯɰŋɳɲɴøɵɸθœɶʘ"
    "ɹɺɾɻʀʁɽʂʃʈʧʉʊʋⱱʌɣɤʍχʎʏʑʐʒʔʡʕʢǀǁǂǃˈˌːˑʼʴʰʱʲʷˠˤ˞↓↑→↗↘'̩'ᵻ"
)
SYMBOLS = PUNCTUATION + LETTERS + IPA_LETTERS
NUM_PHONEME_IDS = NUM_SPECIAL_IDS + len(SYMBOLS)
# A character listed twice keeps its last id, as the reference's dict comprehension does.
_SYMBOL_IDS = {s: i for i, s in enumerate(SYMBOLS, start=NUM_SPECIAL_IDS)}

# espeak-ng voices the model was trained with; language_id = the index in this tuple.
LANGUAGES = (
    "af", "am", "an", "ar", "as", "az", "ba", "bg", "bn", "bpy", "bs", "ca", "cmn", "cs", "cy", "da", "de", "el",
    "en-029", "en-gb", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-gb-x-rp", "en-us", "eo", "es",
    "es-419", "et", "eu", "fa", "fa-latn", "fi", "fr-be", "fr-ch", "fr-fr", "ga", "gd", "gn", "grc", "gu", "hak",
    "hi", "hr", "ht", "hu", "hy", "hyw", "ia", "id", "is", "it", "ja", "jbo", "ka", "kk", "kl", "kn", "ko", "kok",
    "ku", "ky", "la", "lfn", "lt", "lv", "mi", "mk", "ml", "mr", "ms", "mt", "my", "nb", "nci", "ne", "nl", "om",
    "or", "pa", "pap", "pl", "pt", "pt-br", "py", "quc", "ro", "ru", "ru-lv", "sd", "shn", "si", "sk", "sl", "sq",
    "sr", "sv", "sw", "ta", "te", "tn", "tr", "tt", "ur", "uz", "vi", "vi-vn-x-central", "vi-vn-x-south", "yue",
)
UNSUPPORTED_LANGUAGES = {"ja": "Japanese needs the reference's sudachipy reading normalisation (not implemented)"}

_NUMBER_WITH_COMMAS = re.compile(r"([0-9][0-9,]+[0-9])")
_POUNDS = re.compile(r"£([0-9,]*[0-9]+)")
_DOLLARS = re.compile(r"\$([0-9.,]*[0-9]+)")
_DECIMAL = re.compile(r"([0-9]+\.[0-9]+)")
_ORDINAL = re.compile(r"[0-9]+(st|nd|rd|th)")
_INTEGER = re.compile(r"[0-9]+")


@cache
def _inflect() -> Any:
    import inflect

    return inflect.engine()


def _unit(count: int, singular: str) -> str:
    return f"{count} {singular}" + ("" if count == 1 else "s")


def _dollars(m: re.Match) -> str:
    amount = m.group(1)
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " dollars"
    dollars = int(parts[0]) if parts[0] else 0
    cents = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    if dollars and cents:
        return f"{_unit(dollars, 'dollar')}, {_unit(cents, 'cent')}"
    if dollars or cents:
        return _unit(dollars, "dollar") if dollars else _unit(cents, "cent")
    return "zero dollars"


def _integer(m: re.Match) -> str:
    """Years between 1000 and 3000 are read in pairs ("nineteen ninety-nine"), other numbers in full."""
    n, words = int(m.group(0)), _inflect().number_to_words
    if not 1000 < n < 3000:
        return words(n, andword="")
    if n == 2000:
        return "two thousand"
    if 2000 < n < 2010:
        return "two thousand " + words(n % 100)
    if n % 100 == 0:
        return words(n // 100) + " hundred"
    return words(n, andword="", zero="oh", group=2).replace(", ", " ")


def spell_out_numbers(text: str) -> str:
    """Digits -> English words, in the reference's order: thousands commas, pounds, dollars, decimals,
    ordinals, then the remaining integers."""
    text = _NUMBER_WITH_COMMAS.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _POUNDS.sub(r"\1 pounds", text)
    text = _DOLLARS.sub(_dollars, text)
    text = _DECIMAL.sub(lambda m: m.group(1).replace(".", " point "), text)
    text = _ORDINAL.sub(lambda m: _inflect().number_to_words(m.group(0)), text)
    return _INTEGER.sub(_integer, text)


def check_language(language: str) -> str:
    """The espeak-ng voice for a request's `language` (case-insensitive); ValueError names the problem."""
    code = language.lower()
    if code in UNSUPPORTED_LANGUAGES:
        raise ValueError(f"language {language!r} is not supported: {UNSUPPORTED_LANGUAGES[code]}")
    if code not in LANGUAGES:
        raise ValueError(f"language {language!r} is not one of the model's languages ({', '.join(LANGUAGES[:6])}, ...)")
    return code


@cache
def _espeak(language: str) -> Any:
    import logging

    from phonemizer.backend import EspeakBackend

    logger = logging.getLogger("phonemizer")
    logger.setLevel(logging.ERROR)
    return EspeakBackend(language, preserve_punctuation=True, with_stress=True, punctuation_marks=PUNCTUATION,
                         logger=logger)


def phonemize(text: str, language: str) -> str:
    """espeak-ng phonemes of `text` (numbers spelled out first), stress marks and punctuation kept."""
    return _espeak(check_language(language)).phonemize([spell_out_numbers(text)], strip=True)[0]


def phoneme_ids(phonemes: str) -> list[int]:
    """[BOS, one id per character (UNK for unknown ones), EOS]."""
    return [PHONEME_BOS_ID, *(_SYMBOL_IDS.get(ch, PHONEME_UNK_ID) for ch in phonemes), PHONEME_EOS_ID]


def language_id(language: str) -> int:
    return LANGUAGES.index(check_language(language))


def espeak_available() -> str | None:
    """Why phonemisation cannot run here (None when it can): phonemizer or the espeak-ng library missing."""
    try:
        _espeak("en-us")
    except Exception as exc:  # phonemizer raises RuntimeError without the library, ImportError without itself
        return f"{type(exc).__name__}: {exc}"
    return None
