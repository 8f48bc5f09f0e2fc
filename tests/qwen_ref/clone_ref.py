"""Reference side of the Qwen3-TTS Base (voice cloning) equivalence tests; run with the reference venv's python
(it needs librosa: the reference computes the speaker encoder's mel filterbank with it).

usage: clone_ref.py clone CASES_JSON OUT_DIR

Per case: `create_voice_clone_prompt` (the speaker encoder, and for in-context cloning the 12 Hz codec's
`encode`), then a greedy `generate_voice_clone` with that prompt (the case's "non_streaming_mode", default
True).

A case names its checkpoint ("ckpt", a Base checkpoint written by talker_ref.py build), the text, the
language, the reference audio ("ref_audio", a WAV file read as the reference's own loader does), its
transcript ("ref_text") and "x_vector_only_mode". Per case it records the talker's prompt embeddings, the
generated codes [frames, groups], the returned audio (decoded by the speech tokenizer, the reference clip's
part cut off), the reference codes (in-context cases) and the speaker embedding.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from talker_ref import Recorder, stub_audio_io


def read_wav(path: str):
    """(float32 mono samples, sample rate), as the reference's base64 / URL loader reads audio."""
    import soundfile

    audio, sr = soundfile.read(path, dtype="float32", always_2d=False)
    return (audio.mean(axis=-1) if audio.ndim > 1 else audio).astype("float32"), int(sr)


def load(ckpt: str, cache: dict):
    from qwen_tts import Qwen3TTSModel

    if ckpt not in cache:
        tts = Qwen3TTSModel.from_pretrained(ckpt, local_files_only=True, dtype=torch.float32)
        tts.model.eval()
        cache[ckpt] = tts, Recorder(tts.model, decode_audio=True)
    return cache[ckpt]


def clone(cases_path: str, out_dir: str) -> None:
    from safetensors.torch import save_file

    with open(cases_path) as f:
        cases = json.load(f)
    models: dict[str, tuple] = {}
    tensors, meta = {}, []
    for i, case in enumerate(cases):
        tts, recorder = load(case["ckpt"], models)
        audio = read_wav(case["ref_audio"])
        items = tts.create_voice_clone_prompt(ref_audio=audio, ref_text=case.get("ref_text"),
                                              x_vector_only_mode=case["x_vector_only_mode"])
        with torch.no_grad():
            wavs, _ = tts.generate_voice_clone(
                text=case["text"], language=case.get("language"), voice_clone_prompt=items,
                non_streaming_mode=case.get("non_streaming_mode", True),
                do_sample=False, subtalker_dosample=False, max_new_tokens=case["max_new_tokens"],
                repetition_penalty=case.get("repetition_penalty", 1.05))
        call = recorder.calls[-1]
        ref_len = 0 if items[0].ref_code is None else len(items[0].ref_code)  # decoded ahead of the new frames
        tensors[f"{i}.embeds"] = call["embeds"][0].contiguous()
        tensors[f"{i}.codes"] = call["codes"][0][ref_len:].contiguous()
        tensors[f"{i}.audio"] = torch.from_numpy(wavs[0]).float().contiguous()  # the clip's part cut off
        tensors[f"{i}.speaker"] = items[0].ref_spk_embedding.float().contiguous()
        if items[0].ref_code is not None:
            tensors[f"{i}.ref_codes"] = items[0].ref_code.contiguous()
        meta.append({"input_ids": call["input_ids"][0]})
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"))
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(meta, f)
    print(json.dumps({"cases": len(cases)}))


def main() -> None:
    torch.set_num_threads(1)
    stub_audio_io()
    command, args = sys.argv[1], sys.argv[2:]
    {"clone": clone}[command](*args)


if __name__ == "__main__":
    main()
