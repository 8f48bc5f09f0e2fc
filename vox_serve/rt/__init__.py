"""Runtime building blocks: engines, arenas, KV pages, attention backends, sampling kernels.

Submodules that need torch are imported lazily so that pure-Python users (the scheduler imports
the page pool) never pull torch in.
"""

from typing import Any


def build_engine(*args: Any, **kwargs: Any) -> Any:
    from vox_serve.rt.engine import build_engine as _build_engine

    return _build_engine(*args, **kwargs)
