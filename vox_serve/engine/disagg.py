"""A disaggregated engine (`--enable-disaggregation`): the LM half on one device, the codec half on another.

A loaded program is split into two halves (`split_program`): the LM half is the program itself, on its
device; the codec half is a shallow copy of it on the codec device, sharing the weights but with its
own slot state, arenas and pools, and the program's `codec_modules` moved to the codec device. Each half
is then built like any engine (`prepare_engine`: state, warm-up, KV cache, graphs) and registered under
its own engine id, so each has an ordinary spec; the disaggregated spec is the pair
(`{"disaggregated": true, "lm": spec, "codec": spec}`), each half's spec naming its `half` and its
hand-over arena (`handover`: the same layout on both devices).

Per step (worker/disagg_worker.py) the LM half's codec stages gather every codec row's window inputs
(codes, latents) into its hand-over arena; one copy moves them to the codec half's, on the codec
device's stream after an event recorded behind the gathers (CUDA: a peer copy, never through the host;
CPU: an explicit copy between the two arenas); the codec half decodes them. Admissions go to both
halves: the LM half keeps sampling parameters and pages, the codec half the seed and declared slot fields
its codec reads, and resets and primes the codec state.

Devices (engine/placement.py): the codec runs on the GPU after the LM's (`cuda:k` -> `cuda:k+1`; replica i
of `--dp-size` is the pair 2i, 2i+1), or with `--codec-gpu G` on GPU G for every replica (with `--codec-sms N`
on an N-SM partition of it that the replicas' codec halves share, rt/partition.py), or with `--overlap-detok`
on the LM's own GPU (the halves on two streams of one device); on a CPU both halves are on the CPU, as two
separate engines.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from vox_serve.config import VoxConfig
from vox_serve.core.stages import EngineHalf
from vox_serve.engine.placement import codec_device
from vox_serve.rt.program import Program


def move_module(module: torch.nn.Module, device: torch.device) -> None:
    """Move `module` to `device` in place: its parameters and buffers, and plain tensor attributes of its
    submodules (precomputed tables that are neither), which `Module.to` leaves behind."""
    module.to(device)
    for sub in module.modules():
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and value.device != device:
                setattr(sub, name, value.to(device))


def split_program(program: Program, codec_device: torch.device) -> tuple[Program, Program]:
    """(LM half, codec half) of a loaded program that has not been set up yet."""
    if program.half is not EngineHalf.WHOLE:
        raise ValueError(f"the program is already the {program.half} half of a disaggregated engine")
    for module in program.codec_modules():
        move_module(module, codec_device)
    if program.device.type == "cuda" and program.device.index is None:
        # an explicit index, so that each half is driven with its own device current (rt/device.py)
        program.device = torch.device("cuda", torch.cuda.current_device())
    codec = copy.copy(program)  # shares the modules; setup gives it its own state, arenas and pools
    codec.device, codec.half = torch.device(codec_device), EngineHalf.CODEC
    program.half = EngineHalf.LM
    return program, codec


def disaggregated_spec(program: Program, config: VoxConfig) -> dict[str, Any]:
    """Split `program`, build and register both halves; the pair of their specs."""
    from vox_serve.engine.build import engine_of_program

    lm, codec = split_program(program, torch.device(codec_device(str(program.device), config)))
    if config.engine.codec_sms is not None:
        from vox_serve.rt.partition import sm_partition

        codec.partition = sm_partition(codec.device, config.engine.codec_sms)
    if codec.device == lm.device:
        # one GPU (`--overlap-detok`, `--codec-gpu` of the LM's own): the codec half's pools and graphs are
        # allocated first, so that the LM half's KV cache is sized from the memory they leave
        codec_spec = engine_of_program(codec, config)
        return {"disaggregated": True, "lm": engine_of_program(lm, config), "codec": codec_spec}
    return {"disaggregated": True, "lm": engine_of_program(lm, config), "codec": engine_of_program(codec, config)}
