"""The CUDA runtime that PyTorch loaded, called by address: copies, graph launches, events.

The spec-driven worker launches graphs by their `cudaGraphExec_t` handle and copies arenas by
address, exactly as a runtime outside Python does; it uses the libcudart already in the process
(never a second copy), found among the loaded libraries.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

H2D, D2H = 1, 2  # cudaMemcpyKind
EVENT_DISABLE_TIMING = 0x2
PEER_ACCESS_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled: not a failure


def _loaded_cudart() -> ctypes.CDLL:
    """libcudart as mapped into this process (after torch initialised CUDA)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    paths = sorted({line.split()[-1] for line in maps if "libcudart.so" in line and line.split()[-1].startswith("/")})
    if not paths:
        raise RuntimeError("no libcudart is loaded in this process (is CUDA initialised through torch?)")
    return ctypes.CDLL(paths[0])


class CudaRuntime:
    def __init__(self) -> None:
        lib = _loaded_cudart()
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self._memcpy = lib.cudaMemcpyAsync
        self._memcpy.argtypes = [vp, vp, sz, ctypes.c_int, vp]
        self._launch = lib.cudaGraphLaunch
        self._launch.argtypes = [vp, vp]
        self._event_create = lib.cudaEventCreateWithFlags
        self._event_create.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
        self._record = lib.cudaEventRecord
        self._record.argtypes = [vp, vp]
        self._event_sync = lib.cudaEventSynchronize
        self._event_sync.argtypes = [vp]
        self._elapsed = lib.cudaEventElapsedTime
        self._elapsed.argtypes = [ctypes.POINTER(ctypes.c_float), vp, vp]
        self._stream_sync = lib.cudaStreamSynchronize
        self._stream_sync.argtypes = [vp]
        self._wait_event = lib.cudaStreamWaitEvent
        self._wait_event.argtypes = [vp, vp, ctypes.c_uint]
        self._memcpy_peer = lib.cudaMemcpyPeerAsync
        self._memcpy_peer.argtypes = [vp, ctypes.c_int, vp, ctypes.c_int, sz, vp]
        self._can_access_peer = lib.cudaDeviceCanAccessPeer
        self._can_access_peer.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        self._enable_peer = lib.cudaDeviceEnablePeerAccess
        self._enable_peer.argtypes = [ctypes.c_int, ctypes.c_uint]
        self._get_last_error = lib.cudaGetLastError
        self._error = lib.cudaGetErrorString
        self._error.restype = ctypes.c_char_p
        self._error.argtypes = [ctypes.c_int]

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed: {self._error(code).decode()} ({code})")

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        if nbytes:
            self._check(self._memcpy(dst, src, nbytes, kind, stream), "cudaMemcpyAsync")

    def launch(self, graph_exec: int, stream: int) -> None:
        self._check(self._launch(graph_exec, stream), "cudaGraphLaunch")

    def event(self, timing: bool) -> int:
        handle = ctypes.c_void_p()
        self._check(self._event_create(ctypes.byref(handle), 0 if timing else EVENT_DISABLE_TIMING), "cudaEventCreate")
        return handle.value

    def record(self, event: int, stream: int) -> None:
        self._check(self._record(event, stream), "cudaEventRecord")

    def synchronize(self, event: int) -> None:
        self._check(self._event_sync(event), "cudaEventSynchronize")

    def elapsed_ms(self, start: int, end: int) -> float:
        out = ctypes.c_float()
        self._check(self._elapsed(ctypes.byref(out), start, end), "cudaEventElapsedTime")
        return out.value

    def stream_synchronize(self, stream: int) -> None:
        self._check(self._stream_sync(stream), "cudaStreamSynchronize")

    def wait_event(self, stream: int, event: int) -> None:
        """Work queued on `stream` after this waits for the event's last record (any device's)."""
        self._check(self._wait_event(stream, event, 0), "cudaStreamWaitEvent")

    def copy_peer(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """Device-to-device copy between two GPUs, queued on `stream`."""
        if nbytes:
            self._check(self._memcpy_peer(dst, dst_device, src, src_device, nbytes, stream), "cudaMemcpyPeerAsync")

    def enable_peer_access(self, device: int, peer: int) -> bool:
        """Let `device` read `peer`'s memory directly (the current device must be `device`); False where the
        hardware cannot, so that copies between them are staged by the driver."""
        can = ctypes.c_int()
        self._check(self._can_access_peer(ctypes.byref(can), device, peer), "cudaDeviceCanAccessPeer")
        if not can.value:
            return False
        code = self._enable_peer(peer, 0)
        if code == PEER_ACCESS_ALREADY_ENABLED:
            self._get_last_error()  # clear the (non-sticky) error, so that no later call reports it
            return True
        self._check(code, "cudaDeviceEnablePeerAccess")
        return True
