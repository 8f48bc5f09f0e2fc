"""rt.pdl's switch on the CPU: the setting is parsed strictly and nothing but a CUDA tensor's launch takes part
(the GPU tier, tests/test_gpu_kernels.py, checks the launches themselves inside a CUDA graph)."""

from __future__ import annotations

import pytest
import torch

from vox_serve.rt import pdl


@pytest.mark.parametrize("value", ["", "0", "1", "auto", " AUTO "])
def test_cpu_tensors_never_take_part(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pdl.ENV, value)
    assert pdl.launch_options(torch.zeros(1)) == {"PDL": False}


def test_on_where_it_applies_unless_asked_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert pdl._setting() == "auto"


@pytest.mark.parametrize("value", ["yes", "2", "on"])
def test_a_bad_setting_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pdl.ENV, value)
    with pytest.raises(ValueError, match="VOX_PDL"):
        pdl.launch_options(torch.zeros(1))
