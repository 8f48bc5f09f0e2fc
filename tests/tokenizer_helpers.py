"""Tokenizers for the Rust tokenizer and prompt-builder tests: tokenizer.json files built with HF
`tokenizers` in the configurations our checkpoints use, trained on a corpus of unicode, numbers,
punctuation and whitespace runs (the corpus the tests then encode)."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from vox_serve.models.tokenizers.byte_level import byte_level_tokenizer
from vox_serve.models.tokenizers.qwen2 import QWEN2_SPLIT, SPECIAL_TOKENS, tiny_qwen2_tokenizer

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|begin_of_text|>", *SPECIAL_TOKENS]
CORPUS = [
    "Hello world! It's a test, isn't it? I'LL see, we'd've gone.",
    "Numbers: 1234567 and 3.14159, 1,000,000.00; 2024-01-31 12:30:45 #42 $9.99 50% 1e-9",
    "Café naïve résumé — déjà vu… «quotes» “smart” ‘single’ ¿Qué? ¡Sí!",
    "漢字とカタカナ、ひらがな。中文测试！全角ＡＢＣ１２３",
    "한국어 텍스트 조합 \u1100\u1161\u11a8",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷",
    "tabs\tand\t\ttabs\r\nwindows\r\n\r\nlines\n\n\n  spaced   out   ",
    "e\u0301 o\u0308 A\u030a x\u0301\u0323 a\u0323\u0301 decomposed \u212b \u2126",
    "\u3000ideographic\u00a0nbsp\u2003em\u2009thin\u200bzero\u1680ogham",
    "Arabic العربية ١٢٣ Devanagari हिन्दी १२३ Thai ภาษาไทย",
    "'s 'S '\u017f 'll 'LL 'Re x'd can't WON'T ''quoted''",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "special<|im_end|>glued<tts_pad><tts_pad>",
    "  leading and trailing  ", "", " ", "\n", "a\n\n b", "\r\n\r\n", "!!!???...---", "a  <mask>  b mask <mask>",
    "x" * 300,
]


def _train(pattern: str | None, *, nfc: bool = False, ignore_merges: bool = False, byte_regex: bool = False,
           prefix_space: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    steps = [pre_tokenizers.Split(Regex(pattern), behavior="isolated")] if pattern else []
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=byte_regex))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(CORPUS * 10, trainer)
    return tok


def _llama3() -> Tokenizer:
    tok = _train(LLAMA3_SPLIT, ignore_merges=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return tok


def _qwen2() -> Tokenizer:
    tok = _train(QWEN2_SPLIT, nfc=True)
    # Added tokens of every kind: stripped, normalised, single-word.
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=True),
                    AddedToken("mask", single_word=True), AddedToken("caf\u00e9", normalized=True)])
    return tok


def _gpt2() -> Tokenizer:
    tok = _train(None, byte_regex=True, prefix_space=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok


BUILDERS = {"llama3": _llama3, "qwen2": _qwen2, "gpt2": _gpt2, "tiny_qwen2": tiny_qwen2_tokenizer,
            "orpheus_tiny": byte_level_tokenizer}
