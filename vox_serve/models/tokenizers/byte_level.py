"""A byte-level tokenizer built in code, for checkpoints that ship none (tiny and dummy models).

Token ids 0..255 are the bytes (GPT-2 byte alphabet); the Llama-3 begin-of-text id is prepended,
as the real tokenizer does. Real checkpoints always use their own `tokenizer.json`.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

BEGIN_OF_TEXT = 128000


def byte_level_tokenizer(bos_id: int = BEGIN_OF_TEXT) -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<|begin_of_text|>"] = bos_id
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos_id)]
    )
    return tok
