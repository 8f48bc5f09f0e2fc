"""Static arenas: named fixed-shape fields packed into one device buffer, with pinned host mirrors.

A step's inputs are written into a pinned host buffer and copied to the device in one transfer;
its outputs come back in one transfer. Host buffers alternate between steps (`num_host_buffers=2`),
so the host may write step k+1's inputs, and read step k's outputs, while the device still uses
the other pair. Field views never move, so CUDA graphs captured over them stay valid, and the
engine spec can publish each field's address and layout. On a CPU device the device buffer is the
(only) host buffer and copies are no-ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_ALIGN = 256


@dataclass(frozen=True)
class FieldSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = torch.empty((), dtype=self.dtype).element_size()
        for dim in self.shape:
            n *= dim
        return n


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Arena:
    """Fields `spec.name -> tensor` on the device (`dev`) and in the current host buffer (`host`)."""

    def __init__(self, name: str, fields: list[FieldSpec], device: torch.device, num_host_buffers: int = 1) -> None:
        self.name = name
        self.device = torch.device(device)
        self.specs = {f.name: f for f in fields}
        if len(self.specs) != len(fields):
            raise ValueError(f"arena {name} declares a field twice")
        self.offsets: dict[str, int] = {}
        offset = 0
        for f in fields:
            self.offsets[f.name] = offset
            offset += _align(f.nbytes)
        self.nbytes = max(offset, _ALIGN)
        on_cpu = self.device.type == "cpu"
        self._dev_buf = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        self._host_bufs = [self._dev_buf] if on_cpu else [self._pinned() for _ in range(num_host_buffers)]
        self.dev = self._views(self._dev_buf)
        self._host_views = [self._views(buf) for buf in self._host_bufs]
        self.current = 0
        self.host = self._host_views[0]

    def _pinned(self) -> torch.Tensor:
        return torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=True)

    def _views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: buf[self.offsets[name]: self.offsets[name] + s.nbytes].view(s.dtype).view(s.shape)
                for name, s in self.specs.items()}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dev[name]

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    @property
    def num_host_buffers(self) -> int:
        return len(self._host_bufs)

    def select(self, index: int) -> dict[str, torch.Tensor]:
        """Make host buffer `index` (modulo their number) current; returns its views."""
        self.current = index % len(self._host_bufs)
        self.host = self._host_views[self.current]
        return self.host

    def host_views(self, index: int) -> dict[str, torch.Tensor]:
        """The field views of host buffer `index` (modulo their number)."""
        return self._host_views[index % len(self._host_bufs)]

    def end_of(self, name: str) -> int:
        """The byte offset just past field `name` (a prefix that ends with it)."""
        return self.offsets[name] + self.specs[name].nbytes

    def upload(self, nbytes: int | None = None) -> None:
        """Current host buffer -> device, the first `nbytes` (default all): one asynchronous transfer on
        the current stream."""
        host = self._host_bufs[self.current]
        if host is not self._dev_buf:
            n = self.nbytes if nbytes is None else nbytes
            self._dev_buf[:n].copy_(host[:n], non_blocking=True)

    def download(self, nbytes: int | None = None) -> None:
        """Device -> current host buffer, the first `nbytes`: one asynchronous transfer on the current
        stream (read the host views after an event recorded behind it)."""
        host = self._host_bufs[self.current]
        if host is not self._dev_buf:
            n = self.nbytes if nbytes is None else nbytes
            host[:n].copy_(self._dev_buf[:n], non_blocking=True)

    def layout(self) -> dict:
        """JSON-serialisable layout: the buffer addresses and every field's offset, shape, dtype."""
        return {
            "name": self.name,
            "nbytes": self.nbytes,
            "device": str(self.device),
            "device_ptr": self._dev_buf.data_ptr(),
            "host_ptrs": [buf.data_ptr() for buf in self._host_bufs],
            "fields": [
                {
                    "name": f.name,
                    "offset": self.offsets[f.name],
                    "shape": list(f.shape),
                    "dtype": str(f.dtype).removeprefix("torch."),
                    "nbytes": f.nbytes,
                }
                for f in self.specs.values()
            ],
        }
