"""The plain reference pipeline a user would otherwise run: transformers `generate` + SNAC decode.

Same model shapes and dummy weights as `vox-serve --model orpheus --load-format dummy` (random
Orpheus-3B Llama, random SNAC 24 kHz), the same fixed-length requests (`max_tokens` audio tokens,
sampling restricted to the slot's codec range as vox-serve does, so every token is a valid code),
one request at a time and batched. Not streaming: a request's audio exists when it is done, so
its time to first audio is its latency. Prints and writes JSON with the same fields as load.py.

    python benchmark/baseline.py --batch-sizes 1,16,64 --max-tokens 1024 --out benchmark/results/baseline.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vox_serve.bench_report import environment  # noqa: E402
from vox_serve.models.orpheus.loader import ORPHEUS_3B_CONFIG, SNAC_24KHZ_CONFIG  # noqa: E402
from vox_serve.models.orpheus.program import AUDIO_START, CODES_PER_SLOT, PROMPT_END, PROMPT_START  # noqa: E402


def build(device: str):
    from snac import SNAC
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        lm = LlamaForCausalLM(LlamaConfig(**ORPHEUS_3B_CONFIG)).to(torch.bfloat16).eval()
        snac = SNAC(**SNAC_24KHZ_CONFIG).eval()
    return lm, snac


class SlotRange:
    """Logits processor: position p of the generated audio takes slot p % 7's 4096 ids."""

    def __init__(self, prompt_len: int) -> None:
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        slot = (input_ids.shape[1] - self.prompt_len) % 7
        lo = AUDIO_START + CODES_PER_SLOT * slot
        out = torch.full_like(scores, float("-inf"))
        out[:, lo : lo + CODES_PER_SLOT] = scores[:, lo : lo + CODES_PER_SLOT]
        return out


def run_batch(lm, snac, batch: int, max_tokens: int, prompt: list[int]) -> tuple[float, float]:
    """(wall seconds, audio seconds) of one batch generated and decoded."""
    from transformers import LogitsProcessorList

    ids = torch.tensor([prompt] * batch, device=lm.device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                          min_new_tokens=max_tokens, do_sample=True, temperature=0.6, top_p=0.8,
                          repetition_penalty=1.3, pad_token_id=0, eos_token_id=None,
                          logits_processor=LogitsProcessorList([SlotRange(len(prompt))]))
        gen = out[:, len(prompt):]
        frames = gen.shape[1] // 7
        codes = (gen[:, : frames * 7] - AUDIO_START).view(batch, frames, 7) % CODES_PER_SLOT
        levels = [codes[:, :, 0], codes[:, :, [1, 4]].reshape(batch, -1), codes[:, :, [2, 3, 5, 6]].reshape(batch, -1)]
        audio = snac.decode(levels)
    torch.cuda.synchronize()
    return time.perf_counter() - start, batch * audio.shape[-1] / 24000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lm, snac = build("cuda")
    prompt = PROMPT_START + [128000] + list(range(300, 340)) + PROMPT_END
    run_batch(lm, snac, 1, 14, prompt)  # warm-up
    runs = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        wall, audio = run_batch(lm, snac, batch, args.max_tokens, prompt)
        runs.append({"batch": batch, "wall_s": wall, "audio_seconds": audio, "throughput": audio / wall,
                     "ttfa_s": wall, "latency_s": wall})
        print(f"batch {batch:4d}: {wall:7.2f}s wall, {audio:8.1f}s audio, RTF {audio / wall:6.2f}x, "
              f"TTFA = latency {wall * 1000:.0f} ms", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({**environment(), "max_tokens": args.max_tokens, "runs": runs},
                                             indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
