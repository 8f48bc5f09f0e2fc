"""The engine process's allocator settings: freed step buffers are reused, not handed back to the OS.

Every step copies its audio out of the step's output buffer (one block per codec launch: about 1 MB at
256 rows of Qwen3-TTS) and frees the previous blocks once their chunks are sent. With glibc's default
thresholds a block that size is mapped fresh or trimmed back to the OS when freed, so each step
page-faults its audio in again (tens of microseconds per MB). Fixed thresholds keep freed heap memory
for reuse (up to `TRIM_THRESHOLD` bytes of it). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # allocations below this come from the heap
TRIM_THRESHOLD = 256 << 20  # free heap kept before any is returned
_done = False


def keep_freed_buffers() -> bool:
    """Set the thresholds once per process; True when the allocator took them."""
    global _done
    if _done:
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not _done:
        log.warning("mallopt refused the thresholds; step audio buffers may page-fault every step")
    return _done
