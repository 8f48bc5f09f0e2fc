"""The engine: builds a model's program for one device, captures it, and publishes its engine spec."""

from vox_serve.engine.build import build_engine
from vox_serve.engine.registry import get_engine

__all__ = ["build_engine", "get_engine"]
