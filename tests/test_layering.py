"""The layering the design states, checked on every import (module level and inside functions).

Torch stack, lowest first: core -> rt -> layers, codecs -> models -> engine -> worker -> the runtime
modules (bench, scheduler_entry, launch, api); the scheduler, the simulator and the engine loop sit on
core beside rt. A module imports only its own layer or
lower ones. Torch-free: core, scheduler, sim, api and the plain modules they use import no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vox_serve"
RANK = {  # module path prefix under vox_serve -> layer (higher may import lower)
    "core": 0, "config": 0, "request_builder": 0, "audio_input": 0, "audio": 0, "ipc": 0, "text_sessions": 0,
    "metrics": 0, "prompt_pool": 0, "__init__": 0, "audio_upload": 0, "progress": 0, "stage_stats": 1,
    "voice_prompt": 0, "formats": 0, "bench_report": 0, "replica_transport": 0, "cpu_cores": 0,
    "scheduler": 1, "sim": 2, "trace": 2,
    "rt": 1, "layers": 2, "codecs": 2, "models": 3, "engine": 4, "worker": 5,
    "engine_loop": 2, "bench": 6, "rust_host": 6, "scheduler_entry": 6, "launch": 7, "cli": 7, "api": 7, "_rt": 0,
    "client": 6,
}
TORCH_FREE = ("core", "scheduler", "sim", "api", "config", "request_builder", "ipc", "text_sessions", "metrics",
              "trace", "engine_loop", "cli", "launch", "stage_stats", "voice_prompt", "formats", "client",
              "audio_upload", "progress", "bench_report", "replica_transport", "cpu_cores")
TORCH_MODULES = ("torch", "triton", "flashinfer")


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def _modules() -> list[tuple[str, Path]]:
    return [(".".join(("vox_serve", *p.relative_to(PACKAGE).with_suffix("").parts)), p)
            for p in sorted(PACKAGE.rglob("*.py"))]


def test_no_layer_imports_a_higher_one() -> None:
    wrong = []
    for module, path in _modules():
        own = RANK[_layer(module)]
        for imported in _imports(path):
            if imported.startswith("vox_serve.") and RANK[_layer(imported)] > own:
                wrong.append(f"{module} (layer {own}) imports {imported} (layer {RANK[_layer(imported)]})")
    assert not wrong, "\n".join(wrong)


def test_torch_free_layers_import_no_torch() -> None:
    wrong = []
    for module, path in _modules():
        if _layer(module) in TORCH_FREE:
            wrong += [f"{module} imports {m}" for m in _imports(path) if m.split(".")[0] in TORCH_MODULES]
    assert not wrong, "\n".join(wrong)


def test_every_module_has_a_layer() -> None:
    assert all(_layer(module) in RANK for module, _ in _modules())
