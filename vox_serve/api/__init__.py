"""The HTTP API of the Python runtime: a FastAPI app in front of one scheduler process per replica."""
