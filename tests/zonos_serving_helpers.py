"""Serving the Zonos program on CPU through the real scheduler and the spec-driven worker (tests only).

`fixture_program` wraps the fixture checkpoint (tests/fixtures/zonos, made by upstream Zonos) in a
ZonosProgram with a tiny random DAC; `scenario_request` turns a fixture scenario (its recorded
conditioning, guidance scale and sampling) into a request; `serve` runs requests to the end and keeps
each one's streamed PCM.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from tests.engine_helpers import make_loop, prepare
from tests.zonos_helpers import FIXTURES
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.request import Request, SamplingParams
from vox_serve.models.zonos.loader import DAC_TINY, dummy_dac, load_zonos_lm
from vox_serve.models.zonos.program import ZonosProgram, zonos_meta
from vox_serve.models.zonos.prompt import DELAY_STEPS, ZonosPrompter, prefix_prompt

SCENARIOS = json.loads((FIXTURES / "scenarios.json").read_text())
SERVED = ("greedy", "greedy_short", "max_tokens")  # the scenarios without an audio prefix


def config(device: str = "cpu", engine: EngineConfig | None = None, **scheduler: Any) -> VoxConfig:
    cache = scheduler.pop("cache", CacheConfig(page_size=4, max_num_pages=256))
    sched = {"max_batch_size": 4, "max_prefill_tokens": 128, "max_codec_batch": 4, "detokenize_interval": 4,
             **scheduler}
    return VoxConfig(model=ModelConfig(model="zonos-fixture", device=device), cache=cache,
                     scheduler=SchedulerConfig(**sched), engine=engine or EngineConfig())


def fixture_program(cfg: VoxConfig) -> ZonosProgram:
    """The fixture checkpoint in float32 on the config's device, with a tiny random DAC."""
    dev = torch.device(cfg.model.device)
    lm = load_zonos_lm(FIXTURES / "checkpoint", dev, torch.float32)
    dac = dummy_dac(DAC_TINY, dev, torch.float32, seed=1)
    program = ZonosProgram(lm, dac, ZonosPrompter(lm, None), zonos_meta("zonos-fixture", 256, lm.cfg.d_model),
                           dev, torch.float32)
    return prepare(program, cfg)


def expected() -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / "expected_generation.safetensors")


def scenario_request(name: str, conditioning: torch.Tensor, req_id: str | None = None) -> Request:
    g = SCENARIOS[name]["generate"]
    p = dict(g["sampling_params"])
    sampling = SamplingParams(temperature=p.get("temperature", 1.0), top_k=p.get("top_k", 0),
                              min_p=p.get("min_p", 0.0),  # the reference's dict replaces its min_p default
                              repetition_penalty=p.get("repetition_penalty", 3.0),
                              repetition_window=p.get("repetition_penalty_window", 2),
                              max_tokens=g["max_new_tokens"] + DELAY_STEPS, seed=5)
    prompt = prefix_prompt(conditioning, cfg_scale=g["cfg_scale"], num_frames=g["max_new_tokens"])
    return Request(req_id or name, prompt, sampling)


def serve(program: ZonosProgram, cfg: VoxConfig, reqs: list[Request], **options: Any) -> list[Request]:
    loop = make_loop(program, cfg, **options)
    for req in reqs:
        req.extra["pcm"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["pcm"].append(pcm)
        loop.scheduler.add_request(req)
    loop.run_until_idle()
    loop.scheduler.pool.check()
    assert loop.scheduler.pool.num_free == loop.scheduler.pool.num_usable
    return reqs


def codes_of(req: Request) -> torch.Tensor:
    """The request's frames as [9, F] (the reference's codes layout)."""
    return torch.tensor(req.codes, dtype=torch.long).view(-1, 9).T


def pcm_of(req: Request) -> np.ndarray:
    return np.frombuffer(b"".join(req.extra["pcm"]), dtype=np.int16).astype(np.float64)


def one_shot_pcm(program: ZonosProgram, codes: torch.Tensor) -> np.ndarray:
    """The whole utterance decoded at once, as int16 steps (what streaming must reproduce)."""
    with torch.inference_mode():
        audio = program.dac.decode(codes[None].to(program.device))[0].float().clamp(-1, 1)
    return (audio * 32767.0).round().cpu().numpy()
