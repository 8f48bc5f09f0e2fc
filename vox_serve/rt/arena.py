"""Static arenas: named fixed-shape fields packed into one device buffer with a pinned host mirror.

An input arena is filled on the host and copied to the device in one transfer per step; an
output arena is copied back in one transfer. Field views never move, so CUDA graphs captured
over them stay valid, and the engine spec can publish each field's address and layout.
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
    """Fields `spec.name -> tensor` on the device (`dev`) and on the host (`host`).

    On a CPU device both views share one buffer and the copies are no-ops.
    """

    def __init__(self, name: str, fields: list[FieldSpec], device: torch.device) -> None:
        self.name = name
        self.device = torch.device(device)
        self.specs = {f.name: f for f in fields}
        self.offsets: dict[str, int] = {}
        offset = 0
        for f in fields:
            self.offsets[f.name] = offset
            offset += _align(f.nbytes)
        self.nbytes = max(offset, _ALIGN)
        on_cpu = self.device.type == "cpu"
        self._dev_buf = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        self._host_buf = (
            self._dev_buf if on_cpu else torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=True)
        )
        self.dev = {f.name: self._view(self._dev_buf, f) for f in fields}
        self.host = {f.name: self._view(self._host_buf, f) for f in fields}

    def _view(self, buf: torch.Tensor, spec: FieldSpec) -> torch.Tensor:
        start = self.offsets[spec.name]
        return buf[start : start + spec.nbytes].view(spec.dtype).view(spec.shape)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dev[name]

    def upload(self) -> None:
        """Host -> device, one transfer (asynchronous from pinned memory)."""
        if self._host_buf is not self._dev_buf:
            self._dev_buf.copy_(self._host_buf, non_blocking=True)

    def download(self) -> None:
        """Device -> host, one transfer; synchronises with the producing stream."""
        if self._host_buf is not self._dev_buf:
            self._host_buf.copy_(self._dev_buf, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()

    def snapshot(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(device, host) field views of a copy of the whole arena, taken now.

        One device-to-device copy and one asynchronous device-to-host copy into pinned memory:
        later launches may overwrite the arena while the host copy is still in flight. Read the
        host views once the stream has passed this point (an event recorded after it).
        """
        dev = self._dev_buf.clone()
        if self._host_buf is self._dev_buf:
            host = dev
        else:
            host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            host.copy_(dev, non_blocking=True)
        return ({name: self._view(dev, spec) for name, spec in self.specs.items()},
                {name: self._view(host, spec) for name, spec in self.specs.items()})

    def layout(self) -> dict:
        """JSON-serialisable layout: the buffer addresses and every field's offset, shape, dtype."""
        return {
            "name": self.name,
            "nbytes": self.nbytes,
            "device": str(self.device),
            "device_ptr": self._dev_buf.data_ptr(),
            "host_ptr": self._host_buf.data_ptr(),
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
