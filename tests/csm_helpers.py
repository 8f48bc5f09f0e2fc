"""CSM test machinery: tiny checkpoints written by transformers (`CsmForConditionalGeneration.save_pretrained`),
the reference's greedy generation, and our eager generation loop over our modules (the scheduler-driven
program comes later; this loop is what its stages will do: a paged-KV backbone step, then the depth decoder).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile
import torch

from vox_serve.layers.decoder import paged_attend
from vox_serve.models.csm.layers import sample_frame, stop_rows
from vox_serve.models.csm.loader import CSM_TINY_CONFIG, CsmModules
from vox_serve.models.tokenizers.byte_level import CSM_SPECIAL_TOKENS, byte_level_tokenizer
from vox_serve.rt.attention import AttentionBuffers, AttentionPlan, PlanInputs, TorchAttentionBackend

PAGE_SIZE = 16
INIT_STD = 0.2  # random weights with visibly different logits (transformers' default 0.02 is nearly uniform)


def csm_tokenizer():  # noqa: ANN201
    return byte_level_tokenizer(specials=CSM_SPECIAL_TOKENS)


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Move the weights transformers initialises to constants (norms, layer scales, Mimi's codebooks, which
    start at zero) to random values, so that a weight we load wrongly shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("cluster_usage"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def reference_config(config: dict | None = None):  # noqa: ANN201
    from transformers import CsmConfig

    cfg = dict(config or CSM_TINY_CONFIG)
    depth = {**cfg.pop("depth_decoder_config"), "initializer_range": INIT_STD}
    return CsmConfig(**cfg, depth_decoder_config=depth, initializer_range=INIT_STD)


def write_tiny_csm(path: Path, seed: int = 0, config: dict | None = None) -> Path:
    """A tiny random CSM checkpoint, written by transformers, with our tiny tokenizer's tokenizer.json."""
    from transformers import CsmForConditionalGeneration

    torch.manual_seed(seed)
    model = CsmForConditionalGeneration(reference_config(config)).eval()
    perturb(model, seed + 1)
    model.save_pretrained(path)
    csm_tokenizer().save(str(path / "tokenizer.json"))
    return path


def scale_weights(ckpt: Path, dst: Path, scales: dict[str, tuple[tuple, float]]) -> Path:
    """A copy of a checkpoint with slices of weights scaled: {key: (index, factor)} (steers where greedy
    generation stops, on both sides alike)."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for item in ckpt.iterdir():
        if item.name != "model.safetensors":
            (dst / item.name).write_bytes(item.read_bytes())
    sd = load_file(str(ckpt / "model.safetensors"))
    for key, (index, factor) in scales.items():
        sd[key][index] *= factor
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


CODE0_SCALE = 5.0


def stop_checkpoint(ckpt: Path, dst: Path, zero_last: bool) -> Path:
    """A copy of `ckpt` whose greedy generation stops mid-way, on both sides alike: the depth decoder's heads
    for codebooks 1..30 (and 31 with `zero_last`) zeroed, so greedy picks code 0 there, and the backbone's
    code-0 row scaled, so that its code 0 ends some requests (random weights never stop on their own)."""
    heads = 31 if zero_last else 30
    return scale_weights(ckpt, dst, {"depth_decoder.codebooks_head.weight": ((slice(0, heads),), 0.0),
                                     "lm_head.weight": ((0,), CODE0_SCALE)})


def reference_model(ckpt: Path):  # noqa: ANN201
    from transformers import CsmForConditionalGeneration

    return CsmForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()


def reference_processor():  # noqa: ANN201
    from transformers import CsmProcessor, EncodecFeatureExtractor, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=csm_tokenizer(), bos_token="<|begin_of_text|>",
                                        eos_token="<|end_of_text|>", pad_token="<|end_of_text|>")
    extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
    return CsmProcessor(extractor, tokenizer)


def reference_generate(model, processor, text: str, clips: list[np.ndarray], max_frames: int) -> torch.Tensor:
    """transformers' greedy generation (backbone and depth decoder) for one prompt string in the processor's
    form; returns the generated frames [frames, K].

    The processor's attention mask must go along: without one, `generate` derives it from `pad_token_id`,
    which in CSM's config is the <|AUDIO|> id, and would mask out every context audio frame.
    """
    inputs = processor(text, audio=clips or None, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_frames, do_sample=False, depth_decoder_do_sample=False)
    return out[0]


def reference_text(turns: list[tuple[int, str, bool]]) -> str:
    """The processor's prompt string of (speaker, text, has audio) turns (the chat template's form)."""
    return "".join(f"<|begin_of_text|>[{s}]{t}<|end_of_text|>" + ("<|AUDIO|><|audio_eos|>" if a else "")
                   for s, t, a in turns)


def wav_bytes(samples: np.ndarray, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, samples.astype(np.float32), rate, subtype="FLOAT", format="WAV")
    return buf.getvalue()


def greedy(logits: torch.Tensor, codebook: int) -> torch.Tensor:
    return logits.argmax(dim=-1)


class EagerGenerator:
    """Batched greedy generation through our modules: one paged-KV prefill of all prompts, then decode steps
    of every unfinished row, each ending with whole frames from the depth decoder."""

    def __init__(self, m: CsmModules, max_len: int = 256, max_rows: int = 8) -> None:
        b, w = m.config.backbone, m.backbone.lm_head.weight
        self.m, self.pages_per_seq, self.device = m, -(-max_len // PAGE_SIZE), w.device
        self.attn = TorchAttentionBackend(num_layers=b.num_layers, num_pages=1 + max_rows * self.pages_per_seq,
                                          page_size=PAGE_SIZE, num_q_heads=b.num_heads, num_kv_heads=b.num_kv_heads,
                                          head_dim=b.head_dim, dtype=w.dtype, device=w.device)
        m.depth.allocate(max_rows)

    def _step(self, rows: list[int], ids: torch.Tensor, qo_lens: list[int], kv_lens: list[int]) -> torch.Tensor:
        """One backbone step of sequences `rows` -> the last position's hidden state of each."""
        pages = torch.tensor([[1 + r * self.pages_per_seq + p for p in range(self.pages_per_seq)] for r in rows])
        positions = torch.cat([torch.arange(kv - qo, kv) for qo, kv in zip(qo_lens, kv_lens, strict=True)])
        seq = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(qo_lens))
        slots = pages[seq, positions // PAGE_SIZE].long() * PAGE_SIZE + positions % PAGE_SIZE
        indptr = torch.tensor([0, *np.cumsum(qo_lens)], dtype=torch.int32)
        dev = self.device
        bufs = AttentionBuffers(page_table=pages.int().to(dev), kv_lens=torch.tensor(kv_lens, dtype=torch.int32,
                                                                                      device=dev),
                                qo_indptr=indptr.to(dev), slot_mapping=slots.to(dev))
        plan = AttentionPlan(num_seqs=len(rows), qo_lens=qo_lens, kv_lens=kv_lens, decode=max(qo_lens) == 1)
        self.attn.plan(plan, PlanInputs(None, None, None, None, max_pages_per_seq=pages.shape[1]))
        hidden = self.m.backbone(ids.to(dev), positions.to(dev), paged_attend(self.attn, bufs))
        return hidden[indptr[1:].long().to(dev) - 1]

    @torch.no_grad()
    def generate(self, prompts: list[list[list[int]]], max_frames: int) -> list[list[list[int]]]:
        """Frames per prompt: up to `max_frames`, or through the first stop frame (kept)."""
        eos = self.m.config.ids.codebook_eos
        lens = [len(p) for p in prompts]
        hidden = self._step(list(range(len(prompts))), torch.tensor(sum(prompts, [])), lens, lens)
        out: list[list[list[int]]] = [[] for _ in prompts]
        active = list(range(len(prompts)))
        while active:
            frames = sample_frame(self.m.backbone, self.m.depth, hidden, greedy)
            stopped = stop_rows(frames, eos).tolist()
            for row, frame in zip(active, frames.tolist(), strict=True):
                out[row].append(frame)
            keep = [i for i, row in enumerate(active) if not stopped[i] and len(out[row]) < max_frames]
            if not keep:
                break
            active = [active[i] for i in keep]
            ids = torch.cat([frames[keep].cpu(), torch.full((len(keep), 1), -1)], dim=1)
            kv = [lens[row] + len(out[row]) for row in active]
            hidden = self._step(active, ids, [1] * len(active), kv)
        return out


