"""torch_accel/_torch_fixes.py: what torch_accel fixes in torch 2.11 where no extension point
reaches, each with a test that fails once the installed torch no longer needs the fix."""

from __future__ import annotations

import torch
from torch.utils.dlpack import DLDeviceType

import torch_accel
from torch_accel import _torch_fixes


def test_torch_still_refuses_the_dlpack_device_of_renamed_backends() -> None:
    # Fails once torch tells renamed PrivateUse1 tensors apart itself (pytorch/pytorch#195815):
    # then remove the fix from _torch_fixes.py, and this test.
    t = torch.zeros(2, device="accel")
    try:
        _torch_fixes._original_dlpack_device(t)
    except ValueError as e:
        assert "Unknown device type accel for Dlpack" in str(e)
    else:
        raise AssertionError("torch's __dlpack_device__ takes accel tensors now: drop the fix")


def test_from_dlpack_shares_accel_memory_on_every_device() -> None:
    for index in range(min(2, torch_accel.device_count())):
        x = torch.arange(12.0, device=f"accel:{index}").view(3, 4)[:, 1:]  # strided view
        assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, index)
        y = torch.from_dlpack(x)
        assert y.device == x.device
        assert y.data_ptr() == x.data_ptr() and y.stride() == x.stride()
        y.add_(1)  # one memory
        torch.testing.assert_close(x.cpu(), torch.arange(12.0).view(3, 4)[:, 1:] + 1)


def test_dlpack_of_parameters_capsules_and_other_devices_is_unchanged() -> None:
    p = torch.nn.Parameter(torch.ones(3, device="accel"))
    assert p.__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    assert torch.from_dlpack(p.detach()).device.type == "accel"
    capsule = torch.utils.dlpack.to_dlpack(torch.full((2,), 7.0, device="accel"))
    assert torch.from_dlpack(capsule).cpu().tolist() == [7.0, 7.0]
    assert torch.zeros(1).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    assert torch.Tensor.__dlpack_device__.__name__ == "__dlpack_device__"
