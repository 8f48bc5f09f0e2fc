"""vox-serve: serving speech language models."""

__version__ = "0.1.0"
