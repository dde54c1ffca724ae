"""torch.save / torch.load of accel tensors and modules."""

from __future__ import annotations

import io

import torch

from helpers import same_storage


def _roundtrip(obj: object, **load_kwargs: object) -> object:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tensors_keep_device_values_and_sharing():
    base = torch.arange(12.0).to("accel:1")
    view = base.view(3, 4)[1:]
    loaded = _roundtrip({"base": base, "view": view})
    assert loaded["base"].device == torch.device("accel:1")
    assert torch.equal(loaded["base"].cpu(), torch.arange(12.0))
    assert torch.equal(loaded["view"].cpu(), torch.arange(12.0).view(3, 4)[1:])
    assert same_storage(loaded["base"], loaded["view"])  # one storage, as saved


def test_map_location_cpu_accel_and_index():
    t = torch.randn(5).to("accel:1")
    on_cpu = _roundtrip(t, map_location="cpu")
    assert on_cpu.device == torch.device("cpu") and torch.equal(on_cpu, t.cpu())
    on_accel = _roundtrip(t, map_location="accel")
    assert on_accel.device.type == "accel" and torch.equal(on_accel.cpu(), t.cpu())
    on_zero = _roundtrip(t, map_location="accel:0")
    assert on_zero.device == torch.device("accel:0")
    moved = _roundtrip(t, map_location={"accel:1": "accel:0"})
    assert moved.device == torch.device("accel:0")
    from_cpu = _roundtrip(torch.ones(3), map_location="accel:1")
    assert from_cpu.device == torch.device("accel:1")


def test_modules_and_state_dicts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("accel")
    state = _roundtrip(model.state_dict())
    assert all(v.device.type == "accel" for v in state.values())
    fresh = torch.nn.Linear(4, 2).to("accel:1")
    fresh.load_state_dict(state)
    assert fresh.weight.device == torch.device("accel:1")
    x = torch.randn(3, 4)
    assert torch.equal(fresh(x.to("accel:1")).cpu(), model(x.to("accel")).cpu())
    whole = _roundtrip(model, weights_only=False)
    assert whole.weight.device.type == "accel"
