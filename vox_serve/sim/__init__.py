"""A simulated engine: the worker interface of the real one, a cost model and a virtual clock.

Scheduling policies run unchanged against it, so thousands of streaming requests play out in
seconds on a CPU (no torch here). See docs/scheduling.md.
"""
