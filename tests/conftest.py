"""Shared fixtures: tiny checkpoints written by the reference implementations, in the published layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TINY_SNAC = {
    "sampling_rate": 24000, "encoder_dim": 8, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 64,
    "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
    "vq_strides": [4, 2, 1], "noise": True, "depthwise": True,
}
TINY_LLAMA = {
    "vocab_size": 156940, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 131072,
    "rope_theta": 500000.0, "tie_word_embeddings": True, "initializer_range": 0.2,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


@pytest.fixture(scope="module")
def one_torch_thread():  # noqa: ANN201
    """One intra-op thread for a module: tiny convs are dominated by thread start-up on a shared CPU
    (one thread is ~10x faster there)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def write_tiny_orpheus(path: Path, seed: int = 0) -> Path:
    """A tiny random Orpheus checkpoint: transformers' LlamaForCausalLM + PyPI snac, saved by them."""
    from snac import SNAC
    from transformers import LlamaConfig, LlamaForCausalLM

    from vox_serve.models.tokenizers.byte_level import byte_level_tokenizer

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()
    model.save_pretrained(path, safe_serialization=True)
    byte_level_tokenizer().save(str(path / "tokenizer.json"))
    torch.manual_seed(seed + 1)
    snac = SNAC(**TINY_SNAC).eval()
    (path / "snac").mkdir()
    (path / "snac" / "config.json").write_text(json.dumps(TINY_SNAC))
    torch.save(snac.state_dict(), path / "snac" / "pytorch_model.bin")
    return path


@pytest.fixture(scope="session")
def tiny_orpheus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_orpheus(tmp_path_factory.mktemp("orpheus-tiny-ckpt"))


@pytest.fixture(scope="session")
def tiny_csm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CSM checkpoint written by transformers' save_pretrained (csm_helpers.write_tiny_csm)."""
    from csm_helpers import write_tiny_csm

    return write_tiny_csm(tmp_path_factory.mktemp("csm-tiny-ckpt"))


@pytest.fixture(scope="session")
def csm_stop_dirs(tiny_csm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the tiny CSM checkpoint that stop mid-way (csm_helpers.stop_checkpoint): the stop frame
    keeps a code in its last codebook ("last-code-kept") or is all zero ("all-zero")."""
    from csm_helpers import stop_checkpoint

    root = tmp_path_factory.mktemp("csm-stop")
    return {name: stop_checkpoint(tiny_csm_dir, root / name, zero_last=name == "all-zero")
            for name in ("last-code-kept", "all-zero")}
