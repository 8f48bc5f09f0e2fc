"""A byte-level tokenizer built in code, for checkpoints that ship none (tiny and dummy models).

Token ids 0..255 are the bytes (GPT-2 byte alphabet); the Llama-3 begin-of-text id is prepended,
as the real tokenizer does. `specials` adds special tokens at their real ids (split out of the text
before the bytes are tokenized, as in the real tokenizer). Real checkpoints always use their own
`tokenizer.json`.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

BEGIN_OF_TEXT = 128000
# The Llama-3 special tokens CSM's prompts use, at their ids in the released tokenizer.
CSM_SPECIAL_TOKENS = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|AUDIO|>": 128002,
                      "<|audio_eos|>": 128003}


def byte_level_tokenizer(bos_id: int = BEGIN_OF_TEXT, specials: dict[str, int] | None = None) -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<|begin_of_text|>"] = bos_id
    vocab.update(specials or {})  # an added token already in the vocabulary keeps that id
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos_id)]
    )
    if specials:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok
