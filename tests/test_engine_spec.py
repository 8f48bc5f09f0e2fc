"""build_engine returns a complete, JSON-serialisable engine spec; arenas pack their fields exactly."""

from __future__ import annotations

import json

import torch

from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.engine import build_engine
from vox_serve.engine.build import get_program
from vox_serve.rt.arena import Arena, FieldSpec


def test_engine_spec_is_json_with_complete_layouts() -> None:
    config = VoxConfig(model=ModelConfig(model="orpheus-tiny", device="cpu"),
                       cache=CacheConfig(max_num_pages=64, max_model_len=256),
                       scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=64, max_codec_batch=4))
    spec = build_engine(config)
    spec = json.loads(json.dumps(spec))  # survives a JSON round trip
    assert spec["meta"]["sample_rate"] == 24000
    assert spec["meta"]["codes_per_frame"] == 7
    assert spec["attention"]["num_pages"] == 65 and spec["attention"]["layout"] == "NHD"
    assert set(spec["arenas"]) == {"prefill_in", "prefill_out", "decode_in", "decode_out", "codec_in", "codec_out"}
    assert spec["stages"]["decode"]["buckets"] == [1, 2, 4]
    decode_in = {f["name"]: f for f in spec["arenas"]["decode_in"]["fields"]}
    for name in ("input_ids", "positions", "slot_mapping", "page_table", "kv_lens", "temperature", "history"):
        assert name in decode_in
    assert decode_in["page_table"]["shape"] == [4, 16] and decode_in["page_table"]["dtype"] == "int32"
    codec_out = spec["arenas"]["codec_out"]["fields"][0]
    assert codec_out["name"] == "pcm" and codec_out["shape"] == [4, 2048] and codec_out["dtype"] == "int16"
    program = get_program(spec["engine_id"])
    assert program.arenas["decode_in"].layout()["device_ptr"] == spec["arenas"]["decode_in"]["device_ptr"]


def test_arena_fields_do_not_overlap_and_views_alias_the_buffer() -> None:
    fields = [FieldSpec("a", (3, 5), torch.int64), FieldSpec("b", (7,), torch.float32),
              FieldSpec("c", (2, 2), torch.int16)]
    arena = Arena("t", fields, torch.device("cpu"))
    spans = sorted((f["offset"], f["offset"] + f["nbytes"]) for f in arena.layout()["fields"])
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert spans[-1][1] <= arena.nbytes
    arena.host["b"][:] = 2.5
    arena.host["a"][:] = -1
    assert torch.all(arena["b"] == 2.5) and torch.all(arena["a"] == -1)  # CPU: host and device are one buffer
    arena.upload()
    arena.download()
    assert torch.all(arena["c"] == 0)  # untouched fields stay zero


def test_arena_snapshot_is_a_copy_taken_now() -> None:
    arena = Arena("out", [FieldSpec("tokens", (4, 2), torch.int64), FieldSpec("kind", (4,), torch.int32)],
                  torch.device("cpu"))
    arena.host["tokens"][:] = torch.arange(8).view(4, 2)
    dev, host = arena.snapshot()
    arena.host["tokens"][:] = -1  # the next launch overwrites the arena
    assert torch.equal(host["tokens"], torch.arange(8).view(4, 2))
    assert torch.equal(dev["tokens"], host["tokens"]) and host["kind"].dtype == torch.int32
