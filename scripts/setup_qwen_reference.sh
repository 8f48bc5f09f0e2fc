#!/usr/bin/env bash
# The Qwen3-TTS reference implementation (PyPI qwen-tts) in its own virtual environment: it pins
# transformers 4.57.3, which the main environment does not use. Tests that compare against it run
# its code in a subprocess with this interpreter (.venv-qwen/bin/python). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${QWEN_REF_VENV:-.venv-qwen}
# qwen_tts/__init__ imports its demo's audio stack; the tests import the model modules directly, so
# presence is checked without running that __init__. librosa: the Base model's mel filterbank.
CHECK='import importlib.util as u, sys; sys.exit(u.find_spec("qwen_tts") is None or u.find_spec("librosa") is None)'
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  python3 -m venv "$VENV"
  bash scripts/install_torch.sh "$VENV/bin/python"  # the CPU build on a CPU machine, as for the main environment
  "$VENV/bin/pip" install -q torch==2.13.0 "transformers==4.57.3" "accelerate==1.12.0" einops soundfile \
    safetensors numpy librosa
  # qwen-tts's other requirements (gradio, onnxruntime, sox, torchaudio) serve its demo and audio I/O,
  # not the model classes the tests use.
  "$VENV/bin/pip" install -q --no-deps "qwen-tts==0.1.1"
fi
"$VENV/bin/python" -c "$CHECK" && "$VENV/bin/python" -c "import transformers; print('qwen-tts reference ready, transformers', transformers.__version__)"
