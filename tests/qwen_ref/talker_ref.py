"""Reference side of the Qwen3-TTS talker equivalence tests; run with the reference venv's python.

usage:
  talker_ref.py build CONFIG_JSON OUT_DIR      tiny checkpoint from the reference classes, in OUT_DIR
                                               (which already holds the tokenizer files); CONFIG_JSON is
                                               a config.json plus "_seed" and "_speech_tokenizer_decoder"
  talker_ref.py generate CASES_JSON OUT_DIR    greedy CustomVoice / VoiceDesign generation per case
                                               (a case's "non_streaming_mode" is passed on when given)
  talker_ref.py tokenize TOKENIZER_DIR STRINGS_JSON OUT_JSON
                                               ids from transformers' tokenizer for that directory

`build` writes what `from_pretrained(dir, local_files_only=True)` needs: the reference's own
`save_pretrained` output (config.json + model.safetensors), generation_config.json and a tiny
`speech_tokenizer/` saved by the reference 12 Hz tokenizer class. `generate` goes through the public
`Qwen3TTSModel.generate_custom_voice` / `generate_voice_design` (prompt building included) and records,
per case, the tokenized ids, the talker's prompt embeddings and the generated codes [frames, groups].
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import types

import torch

OPTIONAL_ROOTS = ("librosa", "sox", "onnxruntime", "torchaudio")


class _Missing(types.ModuleType):
    """A stand-in for an optional package: importing works, using any of it raises."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{attr}: not installed in the reference venv")

        return unavailable


class _MissingFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the missing optional packages (and their submodules) resolve to `_Missing` stubs."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in OPTIONAL_ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Missing(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []


def stub_audio_io() -> None:
    """qwen_tts imports librosa (the Base model's mel front end) and, through the 25 Hz tokenizer,
    sox, onnxruntime and torchaudio; the 12 Hz CustomVoice / VoiceDesign path never calls them.

    transformers is imported first: it probes for optional packages, and must find these missing.
    """
    import transformers  # noqa: F401

    missing = tuple(r for r in OPTIONAL_ROOTS if importlib.util.find_spec(r) is None)
    if missing:
        sys.meta_path.append(_MissingFinder())


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Weights at a scale where greedy choices are far from ties, and no parameter at its default
    (norm weights, biases), so that any weight our loader places wrongly changes the tokens."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "speech_tokenizer" in name:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and leaf == "weight":
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embedding" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # linear and conv weights (the Base model's speaker encoder): std 1/sqrt(fan in)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))


def perturb_codec_encoder(encoder: torch.nn.Module, seed: int) -> None:
    """Scale-preserving random weights for the 12 Hz codec's Mimi encoder: random codebooks (the reference
    initialises them to zeros, which would make every code 0) and layer scales well away from 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in encoder.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "scale":
                p.copy_(0.2 + 0.4 * torch.rand(p.shape, generator=g))
            elif "norm" in name:
                p.copy_((0.8 + 0.4 * torch.rand(p.shape, generator=g)) if leaf == "weight"
                        else 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
        for name, b in encoder.named_buffers():
            if name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("cluster_usage"):
                b.copy_(0.5 + 1.5 * torch.rand(b.shape, generator=g))


def tiny_speech_tokenizer(decoder: dict, path: str, audible: bool = False) -> None:
    """`audible`: random decoder weights scaled to audio of std 0.25 (codec_ref.py's), else the class's
    initialisation, whose zero codebooks decode every code to silence."""
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from transformers import EncodecFeatureExtractor

    encoder = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 8, "intermediate_size": 32, "num_filters": 4, "codebook_size": 2048,
               "codebook_dim": 8, "vector_quantization_hidden_dimension": 8,
               "num_quantizers": 2 * decoder["num_quantizers"], "num_semantic_quantizers": 1, "upsample_groups": 16}
    torch.manual_seed(0)
    # The encoder holds more quantizers than the talker's code groups, as the released one does (32 vs 16):
    # `encoder_valid_num_quantizers` keeps the first ones.
    model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(
        encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=decoder["num_quantizers"]))
    perturb_codec_encoder(model.encoder, 11)
    if audible:
        from codec_ref import perturb as perturb_decoder
        from codec_ref import scale_output

        perturb_decoder(model.decoder)
        g = torch.Generator().manual_seed(3)
        scale_output(model, torch.randint(0, decoder["codebook_size"], (1, 40, decoder["num_quantizers"]), generator=g))
    model.save_pretrained(path)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000).save_pretrained(path)


def build(config_path: str, out_dir: str) -> None:
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    with open(config_path) as f:
        config_dict = json.load(f)
    seed = config_dict.pop("_seed", 0)
    codec_decoder = config_dict.pop("_speech_tokenizer_decoder")
    audible = config_dict.pop("_audible_codec", False)
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**config_dict)).eval()
    perturb(model, seed + 1)
    model.save_pretrained(out_dir, safe_serialization=True)
    # save_pretrained writes every PretrainedConfig attribute into speaker_encoder_config, whose
    # __init__ takes no **kwargs: keep the keys it knows so that from_pretrained can read it back.
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    known = ("mel_dim", "enc_dim", "enc_channels", "enc_kernel_sizes", "enc_dilations", "enc_attention_channels",
             "enc_res2net_scale", "enc_se_channels", "sample_rate")
    saved["speaker_encoder_config"] = {k: v for k, v in saved["speaker_encoder_config"].items() if k in known}
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
                   "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
                   "subtalker_temperature": 0.9, "max_new_tokens": 8192}, f, indent=1)
    tiny_speech_tokenizer(codec_decoder, os.path.join(out_dir, "speech_tokenizer"), audible)
    print(json.dumps({"built": out_dir}))


class Recorder:
    """Captures what the wrapper hands to the model: tokenized ids, talker prompt embeddings, codes."""

    def __init__(self, model, decode_audio: bool = False) -> None:
        """`decode_audio`: run the speech tokenizer's decoder (else the audio is a stub and only codes count)."""
        self.model = model
        self.calls: list[dict] = []
        inner_generate = model.generate
        talker_generate = model.talker.generate

        def generate(**kwargs):
            self.calls.append({
                "input_ids": [t[0].tolist() for t in kwargs["input_ids"]],
                "instruct_ids": [None if t is None else t[0].tolist() for t in kwargs.get("instruct_ids") or []],
            })
            return inner_generate(**kwargs)

        def talker(**kwargs):
            self.calls[-1]["embeds"] = kwargs["inputs_embeds"].detach().clone()
            return talker_generate(**kwargs)

        real_decode = model.speech_tokenizer.decode

        def decode(items):
            self.calls[-1]["codes"] = [item["audio_codes"].detach().clone() for item in items]
            if decode_audio:
                return real_decode(items)
            return [torch.zeros(1).numpy() for _ in items], 24000

        model.generate = generate
        model.talker.generate = talker
        model.speech_tokenizer.decode = decode  # its encode stays: the Base model encodes reference audio


def generate(cases_path: str, out_dir: str) -> None:
    """Each case names its checkpoint ("ckpt"); "eos_scale" multiplies the codec head's EOS row for that
    case only (random weights rarely stop on their own)."""
    from qwen_tts import Qwen3TTSModel
    from safetensors.torch import save_file

    with open(cases_path) as f:
        cases = json.load(f)
    models: dict[str, tuple] = {}
    tensors, meta = {}, []
    for i, case in enumerate(cases):
        if case["ckpt"] not in models:
            tts = Qwen3TTSModel.from_pretrained(case["ckpt"], local_files_only=True, dtype=torch.float32)
            tts.model.eval()
            models[case["ckpt"]] = tts, Recorder(tts.model)
        tts, recorder = models[case["ckpt"]]
        head = tts.model.talker.codec_head.weight
        eos = tts.model.config.talker_config.codec_eos_token_id
        saved = head[eos].clone()
        kwargs = {"language": case.get("language"), "instruct": case.get("instruct"), "do_sample": False,
                  "subtalker_dosample": False, "max_new_tokens": case["max_new_tokens"],
                  "repetition_penalty": case.get("repetition_penalty", 1.05)}
        if "non_streaming_mode" in case:  # False: the text trails the prompt, one token per frame
            kwargs["non_streaming_mode"] = case["non_streaming_mode"]
        with torch.no_grad():
            head[eos] *= case.get("eos_scale", 1.0)
            if case["kind"] == "custom_voice":
                tts.generate_custom_voice(text=case["text"], speaker=case.get("speaker"), **kwargs)
            else:
                tts.generate_voice_design(text=case["text"], **kwargs)
            head[eos] = saved
        call = recorder.calls[-1]
        tensors[f"{i}.embeds"] = call["embeds"][0].contiguous()
        tensors[f"{i}.codes"] = call["codes"][0].contiguous()
        meta.append({"input_ids": call["input_ids"][0],
                     "instruct_ids": call["instruct_ids"][0] if call["instruct_ids"] else None})
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"))
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(meta, f)
    print(json.dumps({"cases": len(cases)}))


def tokenize(tokenizer_dir: str, strings_path: str, out_path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(strings_path) as f:
        strings = json.load(f)
    with open(out_path, "w") as f:
        json.dump([tok(s)["input_ids"] for s in strings], f)


def main() -> None:
    torch.set_num_threads(1)
    stub_audio_io()
    command, args = sys.argv[1], sys.argv[2:]
    {"build": build, "generate": generate, "tokenize": tokenize}[command](*args)


if __name__ == "__main__":
    main()
