"""Runtime building blocks below the models: arenas, CUDA graphs, KV pages, attention backends, sampling
kernels, and the program base class."""
