"""The Qwen2 byte-level BPE tokenizer (used by Qwen3-TTS), from a checkpoint's files or built in code.

A checkpoint ships `tokenizer.json`, or the "slow" files `vocab.json` + `merges.txt` with its special
tokens listed in `tokenizer_config.json` (`added_tokens_decoder`). From the slow files we rebuild what
transformers' converter builds: NFC normalisation, the Qwen2 split regex, byte-level BPE, and the added
tokens at their own ids. `tiny_qwen2_tokenizer()` makes a small tokenizer of the same kind whose special
tokens keep the real ids, for tiny and dummy models (tests save it with `save_tokenizer_files` so that the
reference implementation loads the very same tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from vox_serve.models.tokenizers.user_text import for_user_text
from vox_serve.rt.checkpoint import CheckpointError, read_json

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Special tokens of Qwen2 / Qwen3-TTS that prompts use, at their real ids.
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<tts_text_eod>": 151673,
}
# Whole words the tiny tokenizer merges into one token (the chat-role words, as in the real vocabulary).
TINY_WORDS = ("assistant", "user", "Ġthe", "Ġis", "Hello", "Ġtest")


def _assemble(vocab: dict[str, int], merges: list[tuple[str, str]], specials: dict[str, int]) -> Tokenizer:
    full = dict(vocab)
    full.update(specials)  # an added token already in the model's vocabulary keeps that id
    tok = Tokenizer(models.BPE(vocab=full, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def tiny_qwen2_tokenizer(contiguous_specials: bool = False) -> Tokenizer:
    """Byte-level BPE over the 256 byte symbols plus a few merged words; Qwen's special ids kept (or, with
    `contiguous_specials`, numbered from the vocabulary's end, as transformers numbers slow files' added
    tokens)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    for word in TINY_WORDS:
        left = word[0]
        for ch in word[1:]:
            merged = left + ch
            if merged not in vocab:
                merges.append((left, ch))
                vocab[merged] = len(vocab)
            left = merged
    if contiguous_specials:
        return _assemble(vocab, merges, {t: len(vocab) + i for i, t in enumerate(SPECIAL_TOKENS)})
    return _assemble(vocab, merges, SPECIAL_TOKENS)


def chat_ids(tok: Tokenizer, *parts: str) -> list[int]:
    """Ids of a prompt template: each part is a special token's name (SPECIAL_TOKENS), put in by its id in
    `tok`, or text, tokenized as plain text. The same ids as tokenizing the joined string when the text
    holds no special-token string: a tokenizer splits its input at special tokens before anything else."""
    for_user_text(tok)
    ids: list[int] = []
    for part in parts:
        special = tok.token_to_id(part) if part in SPECIAL_TOKENS else None
        ids += [special] if special is not None else tok.encode(part).ids
    return ids


def save_tokenizer_files(tok: Tokenizer, directory: Path, fast: bool = True) -> None:
    """Write `vocab.json`, `merges.txt` and `tokenizer_config.json` as Qwen2 checkpoints ship them, and
    `tokenizer.json` when `fast`. transformers builds its fast tokenizer from the slow files only when
    there is no `tokenizer.json`, and then numbers the added tokens from the vocabulary's end."""
    spec = json.loads(tok.to_str())
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    vocab = {k: v for k, v in spec["model"]["vocab"].items() if k not in specials}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    config = {
        "tokenizer_class": "Qwen2Tokenizer", "errors": "replace", "model_max_length": 32768,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for t, i in specials.items()
        },
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))
    if fast:
        tok.save(str(directory / "tokenizer.json"))


def load_qwen2_tokenizer(directory: Path) -> Tokenizer:
    """`tokenizer.json` when present, else `vocab.json` + `merges.txt` + `tokenizer_config.json`."""
    if (directory / "tokenizer.json").exists():
        return Tokenizer.from_file(str(directory / "tokenizer.json"))
    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    if not vocab_path.exists() or not merges_path.exists():
        raise CheckpointError(f"{directory} has no tokenizer.json and no vocab.json + merges.txt")
    vocab = read_json(vocab_path)
    merges = []
    for line in merges_path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#version"):
            left, right = line.split(" ")
            merges.append((left, right))
    config_path = directory / "tokenizer_config.json"
    added = read_json(config_path).get("added_tokens_decoder", {}) if config_path.exists() else {}
    specials = {entry["content"]: int(i) for i, entry in added.items()}
    return _assemble(vocab, merges, specials)
