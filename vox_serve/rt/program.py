"""The program abstraction: one model = meta + device state + capturable stages + a prompt builder.

A program owns its weights, its KV cache (through an attention backend), the request state on the
device (`SlotState`, indexed by request slot) and a step's two arenas (`step_in`, `step_out`; see
`step_fields.py`). Its stages read and write only those, with sizes given as Python ints (the
bucket), so each (stage, bucket) pair is capturable as a CUDA graph:

- `prologue`: admissions (a slot's sampling parameters, prompt length, declared slot fields; its
  codec state reset) and page-table updates of the step;
- `codec_prime`: the codec state of admitted requests with a codec prefix, primed with it (`prime_codec`);
- `prefill` / `decode`: one LM launch; the base class derives the launch's device view (`LmBatch`),
  the program's `lm_step` computes and samples, and `LmBatch.commit` records the samples;
- `codec` / `codec_first`: a batch of chunk windows gathered from the slots' codes (`CodecWindow`),
  turned into PCM by the program's `decode_audio`.

A model program implements `lm_step`, `decode_audio`, `kv_geometry` and `preprocess` (and, for a
stateful codec, `allocate_codec` and `reset_codec_slots`); the rest is here.

Disaggregation (`EngineHalf`, `engine/disagg.py`): the same program object is split into an LM half and
a codec half, each with its own device, slot state and arenas. What a program declares decides what goes
where: `codec_modules` (moved to the codec device), `allocate` / `reset_slots` (LM-side pools, such as a
depth transformer's KV or a stop rule's counters) and `allocate_codec` / `reset_codec_slots` / `prime_codec`
(the codec's streaming state). The halves' stages are the base class's; no model code changes per half.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.request import Prompt
from vox_serve.core.stages import EngineHalf, Stage
from vox_serve.rt.arena import Arena
from vox_serve.rt.attention import AttentionBackend
from vox_serve.rt.codec_window import CodecWindow, codec_window, gather_window_inputs, hand_over, handed_over
from vox_serve.rt.lm_batch import LaunchSource, LmBatch, LmSample, decode_batch, prefill_batch
from vox_serve.rt.partition import SmPartition
from vox_serve.rt.slot_state import SAMPLING_FIELDS, SlotState
from vox_serve.rt.step_fields import handover_fields, step_input_fields, step_output_fields


class Program(ABC):
    """Base class of every model program. Subclasses set `meta` and implement the hooks below."""

    meta: ProgramMeta
    attention: AttentionBackend
    limits: EngineLimits
    state: SlotState
    arenas: dict[str, Arena]
    half: EngineHalf = EngineHalf.WHOLE

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.kv_indices: dict[str, Tensor | None] = {}
        self.handover: Arena | None = None  # a disaggregated half's codec-row inputs (`handover_fields`)
        self.partition: SmPartition | None = None  # the SMs a codec half runs on (`--codec-sms`, rt/partition.py)

    # ---- set-up (once, before any capture) ------------------------------------------------
    def setup(self, limits: EngineLimits) -> None:
        """Allocate the slot state, the step arenas and the program's own state pools."""
        if limits.kv_streams != self.meta.layout.kv_streams:
            raise ValueError(f"limits.kv_streams {limits.kv_streams} != the program's {self.meta.layout.kv_streams}")
        self.limits = limits
        m, dev = self.meta, self.device
        self.state = SlotState(m, limits, dev)
        self.arenas = {"step_in": Arena("step_in", step_input_fields(m, limits), dev, num_host_buffers=2),
                       "step_out": Arena("step_out", step_output_fields(m, limits), dev, num_host_buffers=2)}
        pages = limits.kv_streams * limits.max_pages_per_seq  # of a launch row: all its streams
        self.kv_indices = {
            stage: torch.zeros(rows * pages, dtype=torch.int32, device=dev) if self.attention.needs_kv_indices else None
            for stage, rows in (("decode", limits.max_batch), ("prefill", limits.max_prefill_seqs))
        }
        if self.half is not EngineHalf.WHOLE:
            self.handover = Arena("handover", handover_fields(m, limits), dev)
        if self.half.has_lm:
            self.allocate(limits)
        if self.half.has_codec:
            self.allocate_codec(limits)

    def allocate(self, limits: EngineLimits) -> None:  # noqa: B027 - optional hook
        """Program-owned state of the LM stages at its maximum size (depth-transformer KV, stop counters)."""

    def allocate_codec(self, limits: EngineLimits) -> None:  # noqa: B027 - optional hook
        """Program-owned state of the codec stages at its maximum size (a stateful codec's slot pools)."""

    def codec_modules(self) -> list[torch.nn.Module]:
        """The modules the codec stages run (a disaggregated engine moves them to the codec device)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare its codec modules (codec_modules), "
                                  "so it cannot be disaggregated")

    def quantizable_modules(self) -> list[torch.nn.Module]:
        """The modules whose decoder layers `--quantization fp8` quantizes (layers/fp8): none unless declared."""
        return []

    def state_bytes(self) -> int:
        """Device bytes of the request state (slot tables and the program's pools)."""
        return self.state.memory_bytes()

    # ---- stages ----------------------------------------------------------------------------
    def run_stage(self, stage: Stage, bucket: int, num_seqs: int | None = None) -> None:
        """Run `stage` for `bucket` rows (prefill: token rows; `num_seqs` defaults to the captured
        sequence count, max_prefill_seqs)."""
        if stage is Stage.PROLOGUE:
            self.prologue()
        elif stage is Stage.CODEC_PRIME:
            self.codec_prime(bucket)
        elif stage is Stage.PREFILL:
            self.prefill(bucket, self.limits.max_prefill_seqs if num_seqs is None else num_seqs)
        elif stage is Stage.DECODE:
            self.decode(bucket)
        else:
            self.codec(bucket, first=stage is Stage.CODEC_FIRST)

    def prologue(self) -> None:
        """Apply the step's admissions and page-table updates to the slot tables."""
        st, a = self.state, self.arenas["step_in"].dev
        slots = st.slots(a["admit_slot"])
        for name in SAMPLING_FIELDS:
            st[name][slots] = a[f"admit_{name}"]
        st.num_codes.index_fill_(0, slots, 0)
        for f in self.meta.layout.slot_fields:
            st[f.name][slots] = a[f"admit_{f.name}"]
            st[f"{f.name}_len"][slots] = a[f"admit_{f.name}_len"]
        raw = a["page_slot"]
        valid = raw >= 0  # padded entries rewrite the scratch row's first entry with the null page
        index = torch.where(valid, a["page_index"], 0).long()
        st.page_table[st.slots(raw), index] = torch.where(valid, a["page_id"], 0)
        if self.half.has_lm:
            self.reset_slots(slots)
        if self.half.has_codec:
            self.reset_codec_slots(slots)

    def codec_prime(self, rows: int) -> None:
        """Prime the codec slots of admit rows 0..rows-1 (those with a codec prefix come first; the others
        have a prefix of length 0) with their prefixes, read from step_in; the prologue has just reset them."""
        a = self.arenas["step_in"].dev
        self.prime_codec(self.state.slots(a["admit_slot"][:rows]), a["codec_prime_codes"][:rows],
                         a["codec_prime_len"][:rows])

    def _source(self, stage: str) -> LaunchSource:
        return LaunchSource(self.state, self.arenas["step_in"], self.arenas["step_out"], self.limits.page_size,
                            self.limits.repetition_window, self.kv_indices.get(stage))

    def prefill(self, num_tokens: int, num_seqs: int) -> None:
        batch = prefill_batch(self._source("prefill"), num_tokens, num_seqs)
        batch.commit(self.lm_step(batch))

    def decode(self, batch_size: int) -> None:
        batch = decode_batch(self._source("decode"), batch_size)
        batch.commit(self.lm_step(batch))

    def codec(self, batch: int, first: bool = False) -> None:
        """Decode `batch` chunk windows (the LM half of a disaggregated engine: hand their inputs over)."""
        lim, prefix = self.limits, "codec_first" if first else "codec"
        frames = lim.first_frames if first else lim.frames_per_chunk
        step_in = self.arenas["step_in"]
        if self.half is EngineHalf.LM:
            hand_over(self.handover, prefix, gather_window_inputs(self.state, step_in, prefix, batch,
                                                                  self.meta.codec_window(frames)))
            return
        inputs = handed_over(self.handover, prefix, batch) if self.half is EngineHalf.CODEC else None
        window = codec_window(self.state, step_in, self.arenas["step_out"], prefix, batch,
                              self.meta.codec_window(frames), inputs)
        pcm = self.decode_audio(window, frames)
        window.pcm_out[:batch] = (pcm.float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)

    # ---- model hooks -----------------------------------------------------------------------
    @abstractmethod
    def kv_geometry(self) -> tuple[int, int, int, int]:
        """(layers, query heads, KV heads, head dim) of the paged KV cache."""

    @abstractmethod
    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        """Validated request fields -> the prompt (ids [prompt_len, input_columns], and the prompt
        vectors and slot fields the program declares). Raises ValueError."""

    @abstractmethod
    def lm_step(self, batch: LmBatch) -> LmSample:
        """Run the LM over the launch's tokens and sample each row's next token row (capturable)."""

    @abstractmethod
    def decode_audio(self, window: CodecWindow, frames: int) -> Tensor:
        """The PCM [K, frames * samples_per_frame] (float, in [-1, 1]) that the windows emit after their
        lookback: `frames` chunk frames each (capturable)."""

    def warm_up_eager(self) -> None:  # noqa: B027 - optional hook
        """Run, at its largest input, any eager work that serving does outside the stages (reference-audio
        encoders), so the engine's memory measurement includes it before the KV cache is sized."""

    def reset_slots(self, slots: Tensor) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Reset the LM stages' own per-slot state for these slots (admitted this step; may hold the scratch
        slot)."""

    def reset_codec_slots(self, slots: Tensor) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Forget a stateful codec's state for these slots (admitted this step; may hold the scratch slot)."""

    def prime_codec(self, slots: Tensor, codes: Tensor, lengths: Tensor) -> None:
        """Bring the freshly reset codec state of `slots` [K] to where it would be after decoding each slot's
        prefix: frames codes[k, :lengths[k]] of codes [K, codec_prefix_frames, codes_per_frame] int32 (lengths
        may be 0: the state stays fresh). Required of a program that declares `codec_prefix_frames` (capturable)."""
        raise NotImplementedError(f"{type(self).__name__} declares a codec prefix but cannot prime its codec")

    def prompt_builder_spec(self) -> dict[str, Any]:
        """What a prompt builder outside Python needs (tokenizer file, ids, templates); {} when none can."""
        return {}

    def weights_bytes(self) -> int:
        return 0
