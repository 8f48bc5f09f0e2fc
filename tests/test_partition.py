"""SM partitions (`--codec-sms`, rt/partition.py) on the CPU: the sizes the driver grants and the refusals;
what runs on a partition is checked on a GPU (tests/test_gpu_partition.py)."""

from __future__ import annotations

import pytest

from vox_serve.rt.partition import PartitionError, granted_sms, sm_partition


@pytest.mark.parametrize("requested,cc_major,granted", [
    (1, 9, 8), (8, 9, 8), (13, 9, 16), (32, 9, 32), (128, 9, 128), (1, 8, 4), (5, 8, 6), (108, 8, 108)])
def test_a_request_is_rounded_up_to_the_gpus_granularity(requested: int, cc_major: int, granted: int) -> None:
    assert granted_sms(requested, total=132 if cc_major == 9 else 108, cc_major=cc_major) == granted


@pytest.mark.parametrize("requested,total,cc_major,match", [
    (0, 132, 9, "at least one SM"),
    (133, 132, 9, r"does not fit in the 132 SMs of this GPU \(the largest is 128\)"),
    (130, 132, 9, "a partition of 136 SMs does not fit"),
    (8, 80, 7, "compute capability 8.0 or later"),
])
def test_partitions_a_gpu_cannot_make_are_refused(requested: int, total: int, cc_major: int, match: str) -> None:
    with pytest.raises(PartitionError, match=match):
        granted_sms(requested, total=total, cc_major=cc_major)


def test_a_partition_of_a_cpu_is_refused() -> None:
    with pytest.raises(PartitionError, match="partitions a GPU's SMs; the codec runs on cpu"):
        sm_partition("cpu", 16)


def test_a_launch_stream_that_is_no_partitions_is_refused() -> None:
    from vox_serve.rust_host import launch_stream

    with pytest.raises(ValueError, match="spec.sm_partition.stream 0x1234 is no SM partition's stream"):
        launch_stream("cuda:0", 0x1234)
