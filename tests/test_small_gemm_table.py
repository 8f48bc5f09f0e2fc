"""rt.small_gemm's tables: the JSON format (old four-field configurations and the current six), the packaged
tables, and the benchmark's candidate filter that writes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vox_serve.rt import fp8_gemm, small_gemm
from vox_serve.rt.fp8_gemm import GemmConfig
from vox_serve.rt.small_gemm import BlockConfig, Kind

ROOT = Path(__file__).resolve().parents[1]


def test_configurations_round_trip_and_old_tables_read_with_defaults() -> None:
    config = BlockConfig(2, 1024, warps=2, dot=False, stages=1, unroll=True)
    assert BlockConfig.of_list(config.as_list()) == config
    assert BlockConfig.of_list([16, 256, 4, 1]) == BlockConfig(16, 256, 4, True, stages=3, unroll=False)
    assert BlockConfig.of_list([8, 512, 4, 0, 4]) == BlockConfig(8, 512, 4, False, stages=4, unroll=False)
    table = small_gemm.table_from_json([{"kind": "gated", "dtype": "bfloat16", "rows": 2, "n": 8192, "k": 3072,
                                         "config": [8, 512, 4, 0]}])
    assert table == {("gated", "bfloat16", 2, 8192, 3072): BlockConfig(8, 512)}


@pytest.mark.parametrize("path", sorted(small_gemm.TABLES_DIR.glob("*.json")), ids=lambda p: p.name)
def test_packaged_tables_parse_to_valid_configurations(path: Path) -> None:
    data = json.loads(path.read_text())
    assert small_gemm.table_path(data["device"]) == path
    own = small_gemm.table_from_json(data["entries"])
    assert own and len(own) == len(data["entries"])
    table = small_gemm.read_table(path)  # with the table it extends, if any
    assert table.items() >= own.items()
    for (kind, dtype, rows, n, k), config in table.items():
        assert Kind(kind) and dtype in ("bfloat16", "float8_e4m3fn")
        assert rows == small_gemm.rows_bucket(rows) <= small_gemm.MAX_ROWS
        assert n > 0 and k > 0 and config.warps in (1, 2, 4, 8) and config.stages >= 1
        for block in (config.block_n, config.block_k):
            assert block & (block - 1) == 0  # Triton's blocks are powers of two


def test_an_extending_table_is_its_base_with_its_own_entries_on_top() -> None:
    h100 = small_gemm.read_table(small_gemm.table_path("NVIDIA H100 80GB HBM3"))
    h200 = small_gemm.read_table(small_gemm.table_path("NVIDIA H200"))
    gate_up = ("gated", "bfloat16", 1, 8192, 3072)
    fp8 = {k for k in h100 if k[1] == "float8_e4m3fn"}  # the H100's float8 entries: Orpheus and the talker at 1 row
    own = fp8 | {gate_up}
    assert gate_up in h100 and not own & h200.keys() and len(fp8) == 8 and {k[2] for k in fp8} == {1}
    assert {k: v for k, v in h100.items() if k not in own} == h200


def test_float8_weights_take_their_own_entries_else_the_float8_gemm_else_the_activations_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the table has float8 entries for a shape, the rows without one run the float8 GEMM (None here); a
    shape never measured with float8 weights takes its bfloat16 entries."""
    table = {("plain", "float8_e4m3fn", 1, 64, 32): BlockConfig(2, 32),
             ("plain", "bfloat16", 2, 64, 32): BlockConfig(4, 32),
             ("plain", "bfloat16", 2, 48, 32): BlockConfig(8, 32)}
    monkeypatch.setattr(small_gemm, "_table", lambda device: table)
    monkeypatch.setattr(small_gemm, "_measured_fp8", small_gemm._measured_fp8.__wrapped__)
    monkeypatch.setattr(small_gemm.triton_ops, "enabled", lambda t: True)

    def config(rows: int, n: int) -> BlockConfig | None:
        x = SimpleNamespace(shape=(rows, 32), dim=lambda: 2, is_cuda=True, dtype=torch.bfloat16,
                            device=torch.device("cpu"))
        weight = torch.zeros(n, 32, dtype=small_gemm.FP8)
        return small_gemm._config(x, weight, Kind.PLAIN, n, scale=torch.ones(n))

    assert config(1, 64) == BlockConfig(2, 32)
    assert config(2, 64) is None  # measured in float8: the float8 GEMM
    assert config(2, 48) == BlockConfig(8, 32)  # not measured in float8: the bfloat16 entry


@pytest.mark.parametrize("name", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_the_gpus_we_measured_on_have_a_packaged_table(name: str) -> None:
    """torch.cuda.get_device_name() of the cards of benchmark/results (an H100's table since h100-2026-12-07)."""
    assert small_gemm.table_path(name).is_file()


def test_benchmark_candidates_respect_the_register_and_unroll_limits() -> None:
    sys.path.insert(0, str(ROOT / "benchmark"))
    try:
        import small_gemm as bench
    finally:
        sys.path.remove(str(ROOT / "benchmark"))
    gated = bench.Shape("m", "gate_up", Kind.GATED, 8192, 3072)
    for m in (1, 2, 4, 8, 16):
        chosen = bench.candidates(gated, m)
        assert any(c.dot for c in chosen)
        assert all(c.dot for c in chosen) == (m > bench.FMA_MAX_ROWS)
        for c in chosen:
            assert not c.unroll or -(-gated.k // c.block_k) <= bench.MAX_UNROLLED_STEPS
            if not c.dot:
                assert small_gemm.rows_bucket(m) * c.block_n * c.block_k * 2 <= bench.FMA_TILE_PER_WARP * c.warps
    long_k = bench.Shape("m", "down", Kind.PLAIN, 3072, 8192)
    assert not any(c.unroll and c.block_k < 1024 for c in bench.candidates(long_k, 1))


@pytest.mark.parametrize("path", sorted(fp8_gemm.TABLES_DIR.glob("*.json")), ids=lambda p: p.name)
def test_packaged_float8_gemm_tables_parse_to_valid_configurations(path: Path) -> None:
    """rt/fp8_gemm's tables (benchmark/fp8_gemm.py): named as small_gemm's, rows buckets above the small-rows
    kernels' reach, tiles the float8 tensor cores take (powers of two, K blocks of 32 or more)."""
    data = json.loads(path.read_text())
    assert small_gemm.table_path(data["device"], fp8_gemm.TABLES_DIR) == path
    table = fp8_gemm.read_table(path)
    assert table and len(table) == len(data["entries"])
    for (rows, n, k), config in table.items():
        assert rows == small_gemm.rows_bucket(rows) > small_gemm.MAX_ROWS and n % 16 == 0 and k % 16 == 0
        assert config.block_k >= 32 and config.warps in (4, 8) and config.stages >= 1
        assert all(b & (b - 1) == 0 for b in (config.block_m, config.block_n, config.block_k))
        assert GemmConfig.of_list(config.as_list()) == config


@pytest.mark.skipif(fp8_gemm.triton is None, reason="triton not installed")
def test_the_float8_gemm_looks_its_shape_up_by_rows_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA tensor's (rows bucket, N, K) picks the table's entry; a shape without one, VOX_FP8_GEMM=0 and a CPU
    tensor run cuBLASLt's GEMM (None)."""
    entry = GemmConfig(64, 32, 256)
    monkeypatch.setattr(fp8_gemm, "_table", lambda device: {(256, 48, 64): entry})
    weight = torch.zeros(48, 64, dtype=fp8_gemm.FP8)

    def rows(m: int, cuda: bool = True) -> SimpleNamespace:
        return SimpleNamespace(shape=(m, 64), is_cuda=cuda, device=torch.device("cpu"))

    assert fp8_gemm.gemm_config(rows(200), weight) == entry == fp8_gemm.gemm_config(rows(256), weight)
    assert fp8_gemm.gemm_config(rows(257), weight) is None and fp8_gemm.gemm_config(rows(128), weight) is None
    assert fp8_gemm.gemm_config(rows(200, cuda=False), weight) is None
    monkeypatch.setenv(fp8_gemm.ENV, "0")
    assert fp8_gemm.gemm_config(rows(200), weight) is None


def test_a_float8_gemm_table_extends_the_packaged_one(tmp_path: Path) -> None:
    """A sweep's table naming a packaged one as "extends" (benchmark/gpu_env.sh extend_table) is that table with
    the sweep's entries on top: one replaced, one added."""
    packaged = fp8_gemm.read_table(small_gemm.table_path("NVIDIA H100 80GB HBM3", fp8_gemm.TABLES_DIR))
    replaced, added = (64, 3072, 3072), (16, 1024, 2048)
    config = GemmConfig(16, 64, 256, stages=3)
    assert replaced in packaged and packaged[replaced] != config and added not in packaged
    entries = [{"rows": rows, "n": n, "k": k, "config": config.as_list()} for rows, n, k in (replaced, added)]
    path = tmp_path / "swept.json"
    path.write_text(json.dumps({"extends": "nvidia-h100-80gb-hbm3.json", "entries": entries}))
    assert fp8_gemm.read_table(path) == packaged | {replaced: config, added: config}
