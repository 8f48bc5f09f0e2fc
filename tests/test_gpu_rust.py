"""GPU tier for the Rust extension: its sampling kernels equal the reference (and the Triton
kernels), inside CUDA graphs too; the driver-API calls (graph launch by handle, async copies,
events) work on PyTorch's streams and graphs; the compiled FlashInfer planners give the plans of
FlashInfer's own Python wrappers."""

from __future__ import annotations

import random

import pytest
import torch
from rust_helpers import require_kernels, require_planner, require_rt
from sampling_helpers import random_case, random_params, to_cuda

from vox_serve.rt import kernels, rust_ops, triton_ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]


def _rust_sample(logits: torch.Tensor, p: kernels.SamplingTensors, history: torch.Tensor | None,
                 allowed: torch.Tensor | None) -> torch.Tensor:
    return rust_ops.sample(logits, allowed, history, p.repetition_penalty, p.temperature, p.top_k, p.top_p, p.min_p,
                           p.seed, p.offset, kernels._SALT_UNIFORM)


# ---- driver API ------------------------------------------------------------------------------

def test_driver_sees_pytorchs_devices() -> None:
    rt = require_rt()
    assert rt.cuda_driver_version() >= 12000
    assert rt.cuda_device_count() == torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    assert rt.cuda_device_props(0) == (props.multi_processor_count, props.major, props.minor)


def test_graph_launch_by_handle_and_events() -> None:
    rt = require_rt()
    x = torch.zeros(1024, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        x.add_(1.0)  # warm-up outside the capture
    stream.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        x.add_(1.0)
    x.zero_()
    torch.cuda.synchronize()
    start, end = rt.Event(0, timing=True), rt.Event(0, timing=True)
    start.record(stream.cuda_stream)
    for _ in range(3):
        rt.graph_launch(0, graph.raw_cuda_graph_exec(), stream.cuda_stream)
    end.record(stream.cuda_stream)
    end.synchronize()
    assert end.query()
    assert start.elapsed_ms(end) >= 0.0
    assert torch.equal(x, torch.full_like(x, 3.0))
    with pytest.raises(RuntimeError, match="null graph"):
        rt.graph_launch(0, 0, stream.cuda_stream)


def test_async_copies_on_a_stream() -> None:
    rt = require_rt()
    host = torch.arange(4096, dtype=torch.int32).pin_memory()
    device = torch.empty(4096, dtype=torch.int32, device="cuda")
    back = torch.zeros(4096, dtype=torch.int32).pin_memory()
    stream = torch.cuda.Stream()
    nbytes = host.numel() * 4
    rt.memcpy_htod_async(0, device.data_ptr(), host.data_ptr(), nbytes, stream.cuda_stream)
    rt.memcpy_dtoh_async(0, back.data_ptr(), device.data_ptr(), nbytes, stream.cuda_stream)
    rt.stream_synchronize(0, stream.cuda_stream)
    assert torch.equal(back, host)
    with pytest.raises(RuntimeError, match="device 99"):
        rt.stream_synchronize(99, 0)


# ---- sampling kernels ------------------------------------------------------------------------

def test_rust_hash_uniforms_are_bit_identical() -> None:
    require_kernels()
    seed = torch.randint(-2**62, 2**62, (37,), dtype=torch.int64)
    offset = torch.randint(-2**40, 2**40, (37,), dtype=torch.int64)
    for n, salt in [(1, kernels._SALT_UNIFORM), (4097, kernels._SALT_UNIFORM), (300, kernels._SALT_NORMAL_ANGLE)]:
        ref = kernels._bits_to_uniform(kernels._hash_bits(seed, offset, n, salt))
        assert torch.equal(rust_ops.hash_uniform(seed.cuda(), offset.cuda(), n, salt).cpu(), ref)


@pytest.mark.parametrize("vocab", [17, 2048, 3072, 4097, 8192])
def test_rust_sampler_draws_the_reference_tokens(vocab: int) -> None:
    require_kernels()
    gen = torch.Generator().manual_seed(vocab)
    logits, allowed, history, params = random_case(256, vocab, gen)
    ref = kernels.sample(logits, params, history, allowed)
    got = _rust_sample(logits.cuda(), to_cuda(params), history.cuda(), allowed.cuda()).cpu()
    assert torch.equal(got[:32], ref[:32])  # greedy rows are exact
    assert (got == ref).float().mean().item() >= 0.98  # near-ties may resolve differently in the last bits
    if triton_ops.triton is not None and vocab <= triton_ops.MAX_SAMPLE_VOCAB:
        penalised = kernels.apply_repetition_penalty(logits.cuda(), history.cuda(), params.repetition_penalty.cuda())
        cp = to_cuda(params)
        fused = triton_ops.sample(penalised, allowed.cuda(), cp.temperature, cp.top_k, cp.top_p, cp.min_p, cp.seed,
                                  cp.offset, kernels._SALT_UNIFORM).cpu()
        assert (got == fused).float().mean().item() >= 0.98


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_rust_sampler_draws_the_reference_tokens_at_qwen3_tts_defaults(vocab: int) -> None:
    """Qwen3-TTS's sampling (temperature 0.9, top-k 50, top-p 1.0: rows the kernel samples without
    sorting) for the code predictor's vocabulary and the talker's, whose rows also carry a history."""
    require_kernels()
    gen = torch.Generator().manual_seed(vocab + 1)
    rows = 64
    logits = torch.randn(rows, vocab, generator=gen) * 3
    params = kernels.SamplingTensors.filled(rows, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
    params.seed = torch.randint(0, 2**40, (rows,), generator=gen)
    params.offset = torch.randint(0, 10**6, (rows,), generator=gen)
    params.temperature[:8] = 0.0
    history = torch.randint(-1, vocab, (rows, 256), generator=gen) if vocab == 3072 else None
    ref = kernels.sample(logits, params, history, None)
    got = _rust_sample(logits.cuda(), to_cuda(params), None if history is None else history.cuda(), None).cpu()
    assert torch.equal(got[:8], ref[:8])  # greedy rows are exact
    assert (got == ref).float().mean().item() >= 0.98


@pytest.mark.parametrize("vocab", [2048, 4097])
def test_rust_sampler_with_tied_logits(vocab: int) -> None:
    """Rows whose logits tie: all equal, bf16-rounded (a few hundred distinct values) and a handful of
    values, where the radix selects' bins are shared by whole warps; ties resolve by ascending id."""
    require_kernels()
    gen = torch.Generator().manual_seed(vocab + 2)
    rows = 96
    noise = torch.randn(rows, vocab, generator=gen) * 3
    logits = torch.cat([torch.zeros(rows // 3, vocab), noise[rows // 3:2 * rows // 3].bfloat16().float(),
                        noise[2 * rows // 3:].round().clamp(-2, 2)])
    params = kernels.SamplingTensors.filled(rows, temperature=0.9, top_k=50, top_p=1.0)
    params.top_p[1::2] = 0.75  # no rank of an all-equal row sits on the boundary (0.02 each)
    params.seed = torch.randint(0, 2**40, (rows,), generator=gen)
    params.offset = torch.randint(0, 10**6, (rows,), generator=gen)
    params.temperature[::16] = 0.0
    ref = kernels.sample(logits, params, None, None)
    got = _rust_sample(logits.cuda(), to_cuda(params), None, None).cpu()
    greedy = params.temperature == 0
    assert torch.equal(got[greedy], ref[greedy])
    assert torch.equal(got[:rows // 3], ref[:rows // 3])  # all-equal rows: exact probabilities
    assert (got == ref).float().mean().item() >= 0.98


def test_rust_sampler_rows_are_independent_and_repeatable() -> None:
    """A row's token depends on its own logits, parameters, seed and offset only."""
    require_kernels()
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(64, 3072, generator=gen) * 2).cuda()
    params = to_cuda(random_params(64, gen, greedy_rows=0))
    whole = _rust_sample(logits, params, None, None)
    assert torch.equal(whole, _rust_sample(logits, params, None, None))
    order = torch.randperm(64, generator=gen).cuda()
    shuffled = kernels.SamplingTensors(**{k: v[order] for k, v in vars(params).items()})
    assert torch.equal(_rust_sample(logits[order], shuffled, None, None), whole[order])


def test_dispatch_prefers_the_rust_kernels_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernels()
    calls = []
    real = rust_ops.sample
    monkeypatch.setattr(rust_ops, "sample", lambda *a, **k: calls.append(1) or real(*a, **k))
    gen = torch.Generator().manual_seed(2)
    kernels.sample(torch.randn(4, 100, generator=gen).cuda(), to_cuda(random_params(4, gen)))
    assert calls == [1]
    monkeypatch.setenv("VOX_RUST_KERNELS", "0")
    kernels.sample(torch.randn(4, 100, generator=gen).cuda(), to_cuda(random_params(4, gen)))
    assert calls == [1]


def test_rust_sampler_inside_a_cuda_graph() -> None:
    """Captured on PyTorch's stream and replayed with new inputs, it equals eager launches."""
    require_kernels()
    gen = torch.Generator().manual_seed(3)
    rows, vocab = 16, 3072
    logits = (torch.randn(rows, vocab, generator=gen) * 2).cuda()
    history = torch.randint(-1, vocab, (rows, 8), generator=gen).cuda()
    params = to_cuda(random_params(rows, gen, greedy_rows=4))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        _rust_sample(logits, params, history, None)  # warm-up: loads the kernels outside the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = _rust_sample(logits, params, history, None)
    for step in range(3):
        logits.copy_((torch.randn(rows, vocab, generator=gen) * 2).cuda())
        params.offset.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _rust_sample(logits, params, history, None)), step


# ---- FlashInfer planners ---------------------------------------------------------------------

def _paged_batch(gen: random.Random, batch: int, page_size: int, max_pages: int) -> tuple[list[int], list[int]]:
    """(kv page indptr, last page lengths) of `batch` random sequences."""
    pages = [gen.randint(1, max_pages) for _ in range(batch)]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    return indptr, [gen.randint(1, page_size) for _ in range(batch)]


def _decode_wrapper(cuda_graph: bool, use_tensor_cores: bool, max_batch: int):  # noqa: ANN202
    """FlashInfer's decode wrapper; in graph mode with static CSR buffers for `max_batch` rows."""
    import flashinfer

    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    extra = {}
    if cuda_graph:
        extra = dict(paged_kv_indptr_buffer=torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda"),
                     paged_kv_indices_buffer=torch.zeros(max_batch * 512, dtype=torch.int32, device="cuda"),
                     paged_kv_last_page_len_buffer=torch.zeros(max_batch, dtype=torch.int32, device="cuda"))
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=cuda_graph,
                                                         use_tensor_cores=use_tensor_cores, **extra)


def _shim_for(wrapper, num_qo: int, num_kv: int, head_dim: int, page_size: int, blocks_per_sm: int = 1):  # noqa: ANN001, ANN202
    rt = require_planner()
    props = torch.cuda.get_device_properties(0)
    fws, iws = wrapper._float_workspace_buffer, wrapper._int_workspace_buffer
    return rt.Planner(num_sm=props.multi_processor_count, cc_major=props.major, cc_minor=props.minor,
                      num_qo_heads=num_qo, num_kv_heads=num_kv, head_dim=head_dim, page_size=page_size,
                      float_workspace_addr=fws.data_ptr(), float_workspace_bytes=fws.numel() * fws.element_size(),
                      int_workspace_addr=iws.data_ptr(), int_workspace_bytes=iws.numel() * iws.element_size(),
                      decode_blocks_per_sm=blocks_per_sm)


def _wrapper_plan(wrapper, plan) -> tuple[list[int], bytes]:  # noqa: ANN001
    """Run `plan()` on a FlashInfer wrapper; its plan info and the integer workspace it wrote."""
    pinned = wrapper._pin_memory_int_workspace_buffer
    pinned.zero_()
    plan()
    info = [int(v) for v in wrapper._plan_info]
    return info, pinned.numpy().tobytes()


def _same_plan(ours: tuple[list[int], bytes], theirs: tuple[list[int], bytes]) -> bool:
    info, data = ours
    return info == theirs[0] and data == theirs[1][:len(data)]


def _prefill_wrapper(cuda_graph: bool, batch: int):  # noqa: ANN202
    """FlashInfer's prefill wrapper (`auto` backend); in graph mode with static buffers for `batch`
    sequences (a graph-mode wrapper serves one batch size)."""
    import flashinfer

    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    extra = {}
    if cuda_graph:
        extra = dict(qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                     paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                     paged_kv_indices_buf=torch.zeros(batch * 512, dtype=torch.int32, device="cuda"),
                     paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device="cuda"))
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=cuda_graph, **extra)


def _decode_plan(wrapper, indptr: list[int], last: list[int], geometry: tuple[int, int, int, int]  # noqa: ANN001
                 ) -> tuple[list[int], bytes]:
    num_qo, num_kv, head_dim, page_size = geometry
    indices = torch.arange(indptr[-1], dtype=torch.int32, device="cuda")
    return _wrapper_plan(wrapper, lambda: wrapper.plan(
        torch.tensor(indptr, dtype=torch.int32), indices, torch.tensor(last, dtype=torch.int32), num_qo, num_kv,
        head_dim, page_size, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16))


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("heads", [(24, 8), (16, 8)])  # Orpheus and Qwen3-TTS: CUDA-core decode kernels
def test_decode_planner_equals_flashinfers(cuda_graph: bool, heads: tuple[int, int]) -> None:
    require_planner()
    geometry = (*heads, 128, 16)
    # The decode kernel's occupancy is the GPU's to know: find the blocks per SM that reproduce
    # FlashInfer's plans of probe batches (one long sequence alone does not pin it down: several
    # occupancies split it alike); every other plan must then match with it.
    probe_gen = random.Random(3)
    probes = [([0, 400], [5]), _paged_batch(probe_gen, 8, 16, 300), _paged_batch(probe_gen, 64, 16, 300)]

    wrappers = [_decode_wrapper(cuda_graph, use_tensor_cores=False, max_batch=len(last)) for _, last in probes]
    wants = [_decode_plan(w, indptr, last, geometry) for w, (indptr, last) in zip(wrappers, probes, strict=True)]

    def reproduces(b: int) -> bool:
        return all(_same_plan(_shim_for(w, *geometry, b).decode(indptr, cuda_graph), want)
                   for w, (indptr, _), want in zip(wrappers, probes, wants, strict=True))

    blocks = [b for b in range(1, 33) if reproduces(b)]
    assert blocks, "no occupancy reproduces FlashInfer's decode plans"
    gen = random.Random(7)
    for batch in [1, 2, 3, 8, 17, 33, 64]:
        wrapper = _decode_wrapper(cuda_graph, use_tensor_cores=False, max_batch=batch)  # one per batch in a graph
        shim = _shim_for(wrapper, *geometry, blocks[0])
        for _ in range(3):
            indptr, last = _paged_batch(gen, batch, 16, 300)
            assert _same_plan(shim.decode(indptr, cuda_graph), _decode_plan(wrapper, indptr, last, geometry)), batch


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_prefill_planners_equal_flashinfers(cuda_graph: bool) -> None:
    """The prefill wrapper's `auto` backend: FA2's planner, or on Hopper FA3's (PrefillSM90Plan). In
    graph mode the first plan fixes the row count that later, smaller plans are padded to."""
    require_planner()
    num_qo, num_kv, head_dim, page_size = 16, 8, 128, 16
    gen = random.Random(8)
    for batch in [1, 2, 5, 16]:
        wrapper = _prefill_wrapper(cuda_graph, batch)
        shim = _shim_for(wrapper, num_qo, num_kv, head_dim, page_size)
        for longest in (300, 100):  # the second plan has fewer rows than the first
            qo = [0]
            for _ in range(batch):
                qo.append(qo[-1] + gen.randint(1, longest))
            indptr, last = _paged_batch(gen, batch, page_size, 200)
            theirs = _wrapper_plan(wrapper, lambda w=wrapper, qo=qo, indptr=indptr, last=last: w.plan(
                torch.tensor(qo, dtype=torch.int32), torch.tensor(indptr, dtype=torch.int32),
                torch.arange(indptr[-1], dtype=torch.int32, device="cuda"), torch.tensor(last, dtype=torch.int32),
                num_qo, num_kv, head_dim, page_size, causal=True, q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16))
            rows = wrapper._max_total_num_rows if cuda_graph else qo[-1]
            if wrapper._backend == "fa3":
                kv_len = [(indptr[i + 1] - indptr[i] - 1) * page_size + last[i] for i in range(batch)]
                ours = shim.prefill_sm90(qo, indptr, kv_len, rows, causal=True, cuda_graph=cuda_graph)
            else:
                ours = shim.prefill(qo, indptr, rows, cuda_graph=cuda_graph)
            assert _same_plan(ours, theirs), (wrapper._backend, batch)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_tensor_core_decode_uses_the_prefill_planner(cuda_graph: bool) -> None:
    """Decode with tensor cores (GQA groups >= 4) is planned by FA2's prefill planner, one query row
    per sequence."""
    require_planner()
    geometry = (32, 8, 128, 16)
    gen = random.Random(9)
    for batch in [1, 4, 32]:
        wrapper = _decode_wrapper(cuda_graph, use_tensor_cores=True, max_batch=batch)
        shim = _shim_for(wrapper, *geometry)
        indptr, last = _paged_batch(gen, batch, 16, 300)
        theirs = _decode_plan(wrapper, indptr, last, geometry)
        assert wrapper._backend == "fa2"
        ours = shim.prefill(list(range(batch + 1)), indptr, batch, cuda_graph=cuda_graph)
        assert _same_plan(ours, theirs), batch
