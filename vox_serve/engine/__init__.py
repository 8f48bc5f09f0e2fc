"""The engine: builds a model's program for one device, captures it, and publishes its engine spec."""

from vox_serve.engine.build import build_engine, build_program, get_program

__all__ = ["build_engine", "build_program", "get_program"]
