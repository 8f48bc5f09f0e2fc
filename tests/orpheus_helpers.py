"""Running the Orpheus program from a checkpoint directory through the real scheduler and worker."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.engine_helpers import make_loop, prepare
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.engine_loop import EngineLoop
from vox_serve.models.orpheus.loader import load_orpheus
from vox_serve.request_builder import build_request


def make_program(ckpt: Path, constrain: bool = True, frames_per_chunk: int | None = None,
                 max_num_pages: int = 256, max_prefill_tokens: int = 256):
    """The program with SNAC noise off (the reference comparisons add none)."""
    program = load_orpheus(str(ckpt), "auto", torch.device("cpu"), torch.float32, seed=0,
                           max_model_len=512, constrain_audio=constrain)
    program.codec_noise = False
    config = VoxConfig(model=ModelConfig(model=str(ckpt), device="cpu"),
                       cache=CacheConfig(page_size=16, max_num_pages=max_num_pages),
                       scheduler=SchedulerConfig(max_batch_size=8, max_prefill_tokens=max_prefill_tokens,
                                                 detokenize_interval=frames_per_chunk))
    return prepare(program, config), config


def run_requests(program, config, field_sets: list[dict], loop: EngineLoop | None = None,
                 greedy: bool = True) -> list:
    """Run requests to completion (greedy by default); each collects its PCM chunks in extra["chunks"].

    Shared by every model's serving tests (tests/qwen3_tts_helpers.py too)."""
    if loop is None:
        loop = make_loop(program, config)
    reqs = []
    for i, fields in enumerate(field_sets):
        req = build_request(program.meta, program.preprocess, fields, f"r{i}", greedy=greedy, seed=i)
        req.extra["chunks"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["chunks"].append(pcm)
        loop.scheduler.add_request(req)
        reqs.append(req)
    loop.run_until_idle()
    for req in reqs:
        assert req.error is None, req.error
    return reqs
