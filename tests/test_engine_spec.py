"""The engine spec is the contract: complete, JSON-serialisable, and enough to drive the engine alone.

A second driver built from nothing but the spec's JSON (no program object: arenas by address, stages
and the planner by handle) serves requests with greedy output identical to the normal path.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch

from vox_serve.config import BenchConfig, CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.meta import ProgramMeta
from vox_serve.core.request import Prompt, Request
from vox_serve.engine import build_engine, get_engine
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import build_request
from vox_serve.rt.arena import Arena, FieldSpec
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.worker.engine_worker import EngineWorker

CONFIG = VoxConfig(model=ModelConfig(model="orpheus-tiny", device="cpu"),
                   cache=CacheConfig(max_num_pages=64, max_model_len=256),
                   scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=64, max_codec_batch=4),
                   bench=BenchConfig(greedy=True))
FIELDS = [{"text": "Hello there.", "max_tokens": 30}, {"text": "A second request, a bit longer.", "max_tokens": 40},
          {"text": "Third.", "max_tokens": 35, "voice": "leo"}]


def test_engine_spec_is_json_with_complete_layouts() -> None:
    spec = json.loads(json.dumps(build_engine(CONFIG)))  # survives a JSON round trip
    assert spec["version"] == 2 and spec["meta"]["codes_per_frame"] == 7
    assert spec["meta"]["stop_rule"] == {"token": 128258, "column": 0, "min_generated": 0, "at_frame_boundary": True,
                                         "keeps_frame": False, "description": ""}
    assert spec["attention"]["num_pages"] == 65 and spec["attention"]["layout"] == "NHD"
    assert spec["attention"]["dtype"] == spec["attention"]["kv_dtype"] == "float32"
    assert set(spec["arenas"]) == {"step_in", "step_out"}
    step_in = {f["name"]: f for f in spec["arenas"]["step_in"]["fields"]}
    assert sorted(sum(spec["sections"].values(), [])) == sorted(step_in)  # every field in one section
    assert step_in["decode_slot"]["shape"] == [4] and step_in["decode_ids"]["shape"] == [4, 1]
    assert set(spec["conventions"]["padding"]) <= set(step_in)
    assert spec["stages"]["decode"]["buckets"] == [1, 2, 4]
    assert all(set(s["callables"]) == {str(b) for b in s["buckets"]} for s in spec["stages"].values())  # CPU
    program = get_engine(spec["engine_id"]).program
    assert spec["slot_state"]["tables"]["tokens"]["ptr"] == program.state.tokens.data_ptr()
    assert spec["slot_state"]["tables"]["page_table"]["shape"] == [program.limits.slots + 1, 16]
    assert spec["arenas"]["step_in"]["device_ptr"] == program.arenas["step_in"].layout()["device_ptr"]
    assert spec["memory"]["kv_bytes"] == program.attention.memory_bytes()


def _serve(worker: EngineWorker, meta: ProgramMeta, prompts: list[Prompt], normal: list[Request]) -> list[Request]:
    scheduler = make_scheduler(meta, worker.limits, CONFIG.scheduler)
    loop = EngineLoop(scheduler, worker, record=True)
    reqs = []
    for old, prompt in zip(normal, prompts, strict=True):
        req = Request(old.req_id, prompt, old.sampling)
        req.extra["chunks"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["chunks"].append(pcm)
        scheduler.add_request(req)
        reqs.append(req)
    loop.run_until_idle()
    return reqs


def test_a_float8_cache_is_published_and_takes_a_quarter_of_a_float32_ones_bytes() -> None:
    full = build_engine(CONFIG)["attention"]
    narrow = build_engine(dataclasses.replace(CONFIG, cache=dataclasses.replace(CONFIG.cache,
                                                                               kv_cache_dtype="fp8")))["attention"]
    assert (narrow["dtype"], narrow["kv_dtype"], narrow["backend"]) == ("float32", "float8_e4m3fn", "torch")
    assert narrow["num_pages"] == full["num_pages"] and narrow["kv_cache_bytes"] * 4 == full["kv_cache_bytes"]


def test_a_driver_built_from_the_spec_json_alone_gives_the_same_greedy_output() -> None:
    spec = build_engine(CONFIG)
    program = get_engine(spec["engine_id"]).program
    normal = [build_request(program.meta, program.preprocess, f, f"r{i}", greedy=True, seed=i)
              for i, f in enumerate(FIELDS)]
    first = _serve(EngineWorker(spec), program.meta, [r.prompt for r in normal], normal)
    text = json.dumps(spec)
    del program  # the second driver knows only the JSON
    data = json.loads(text)
    meta = ProgramMeta.from_dict(data["meta"])
    second = _serve(EngineWorker(data), meta, [r.prompt for r in normal], normal)
    for a, b in zip(first, second, strict=True):
        assert a.error is None and b.error is None
        assert a.tokens == b.tokens and len(a.tokens) == a.sampling.max_tokens
        assert a.extra["chunks"] == b.extra["chunks"] and a.extra["chunks"]


def test_arena_fields_do_not_overlap_and_host_buffers_alternate() -> None:
    fields = [FieldSpec("a", (3, 5), torch.int64), FieldSpec("b", (7,), torch.float32),
              FieldSpec("c", (2, 2), torch.int16)]
    arena = Arena("t", fields, torch.device("cpu"))
    spans = sorted((f["offset"], f["offset"] + f["nbytes"]) for f in arena.layout()["fields"])
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert spans[-1][1] <= arena.nbytes and arena.end_of("c") == spans[-1][1]
    arena.host["b"][:] = 2.5
    assert torch.all(arena["b"] == 2.5)  # CPU: host and device are one buffer
    assert arena.num_host_buffers == 1 and arena.select(1) is arena.host_views(0)
    assert np.all(arena.host["c"].numpy() == 0)
