"""Random number generation on accel: seeding, generators, states, offsets."""

from __future__ import annotations

import pytest
import torch

import helpers  # test/


def _draw() -> torch.Tensor:
    return torch.cat(
        [
            torch.rand(5, device="accel"),
            torch.randn(5, device="accel"),
            torch.randint(0, 100, (5,), device="accel").float(),
            torch.nn.functional.dropout(torch.ones(8, device="accel"), 0.5),
        ]
    ).cpu()


def test_manual_seed_makes_random_ops_reproducible():
    torch.accel.manual_seed(1234)
    first = _draw()
    torch.accel.manual_seed(1234)
    assert torch.equal(_draw(), first)
    torch.accel.manual_seed(4321)
    assert not torch.equal(_draw(), first)
    assert torch.accel.initial_seed() == 4321


def test_torch_manual_seed_seeds_accel_too():
    torch.manual_seed(7)
    a = torch.rand(4, device="accel").cpu()
    torch.manual_seed(7)
    assert torch.equal(torch.rand(4, device="accel").cpu(), a)


def test_each_device_has_its_own_generator():
    torch.accel.manual_seed_all(99)
    on0 = torch.rand(4, device="accel:0").cpu()
    on1 = torch.rand(4, device="accel:1").cpu()
    assert torch.equal(on0, on1)  # same seed, independent generators
    torch.accel.set_device(1)
    try:
        torch.accel.manual_seed(5)  # only the current device
        assert torch.accel.default_generators[1].initial_seed() == 5
        assert torch.accel.default_generators[0].initial_seed() == 99
    finally:
        torch.accel.set_device(0)


def test_rng_state_round_trips():
    torch.accel.manual_seed(11)
    torch.rand(3, device="accel")
    state = torch.accel.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    after = _draw()
    torch.accel.set_rng_state(state)
    assert torch.equal(_draw(), after)
    states = torch.accel.get_rng_state_all()
    assert len(states) == 2
    x = torch.rand(3, device="accel:1").cpu()
    torch.accel.set_rng_state_all(states)
    assert torch.equal(torch.rand(3, device="accel:1").cpu(), x)
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.accel.set_rng_state(torch.zeros(5, dtype=torch.uint8))


def test_rng_state_offset_functions_as_torch_cuda():
    torch.accel.manual_seed(5)
    assert torch.accel._get_rng_state_offset() == 0
    first = _draw()
    offset = torch.accel._get_rng_state_offset("accel:0")
    assert offset > 0
    torch.accel._set_rng_state_offset(0)
    assert torch.equal(_draw(), first)  # the offset alone decides the next draw
    assert torch.accel._get_rng_state_offset(0) == offset
    torch.accel._set_rng_state_offset(7, device=1)
    assert torch.accel._get_rng_state_offset(1) == 7


def test_rng_state_under_fake_tensors_is_a_real_tensor():
    # Dynamo traces under FakeTensorMode, and code it traces reads generator states (AOTAutograd's
    # rng wrappers): the state was allocated through the dispatcher, got a fake tensor with no
    # memory, and writing the seed into it killed the process.
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    torch.accel.manual_seed(5)
    expected = torch.accel.get_rng_state()
    with FakeTensorMode():
        state = torch.accel.get_rng_state()
        fake = torch.empty(16, dtype=torch.uint8)
    assert not isinstance(state, FakeTensor) and torch.equal(state, expected)
    assert isinstance(fake, FakeTensor)
    with pytest.raises(RuntimeError, match="no data"):
        torch.accel.default_generators[0].set_state(fake)
    assert torch.equal(torch.accel.get_rng_state(), expected)


def test_dropout_masks_are_reproducible_and_scaled():
    x = torch.ones(10_000, device="accel")
    torch.accel.manual_seed(21)
    a = torch.nn.functional.dropout(x, 0.25)
    torch.accel.manual_seed(21)
    b = torch.nn.functional.dropout(x, 0.25)
    assert torch.equal(a.cpu(), b.cpu())
    values = set(a.unique().cpu().tolist())
    assert values == {0.0, torch.tensor(1.0 / 0.75).item()}  # the float32 scale
    kept = (a != 0).float().mean().item()
    assert 0.72 < kept < 0.78  # 10000 Bernoulli(0.75) draws
    assert torch.equal(torch.nn.functional.dropout(x, 0.25, training=False).cpu(), x.cpu())


@pytest.mark.parametrize(
    "shape, dtype",  # below and above the serial limit, and a reduced precision
    [((7, 5), torch.float32), ((512, 256), torch.float32), ((300, 200), torch.bfloat16)],
)
def test_dropout_of_a_contiguous_input_is_one_task_with_the_operators_numbers(shape, dtype):
    # On the host executor a contiguous input's dropout is one task (mask drawn, input scaled);
    # a strided one runs the operators (empty, bernoulli_, mul, mul_). Same seed, same numbers.
    # (Elsewhere both run the operators: the same numbers still.)
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    import torch_accel

    x = torch.randn(*shape, dtype=dtype).to("accel")
    strided = x.t().contiguous().t()
    assert not strided.is_contiguous()
    runs = {}
    for name, t in (("one task", x), ("operators", strided)):
        torch.accel.manual_seed(3)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            out, mask = torch.ops.aten.native_dropout(t, 0.3, True)
            torch.accel.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
        runs[name] = (out.cpu(), mask.cpu(), kernels)
    if torch_accel.executor()[0] == "host":
        assert runs["one task"][2] == ["aten::native_dropout"]
        assert "aten::bernoulli_.float" in runs["operators"][2]
    assert torch.equal(runs["one task"][0], runs["operators"][0])
    assert torch.equal(runs["one task"][1], runs["operators"][1])
    kept = runs["one task"][1].float().mean().item()
    assert abs(kept - 0.7) < (0.1 if shape == (7, 5) else 0.01)
    torch.testing.assert_close(runs["one task"][0], (x.cpu() * runs["one task"][1]) / 0.7)


def test_dropout_of_integers_raises_at_the_call_as_on_the_cpu():
    # The operators raise it (an integer tensor cannot be scaled in place), not a task later.
    for device in ("cpu", "accel"):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            torch.nn.functional.dropout(torch.ones(4, 4, dtype=torch.int64, device=device), 0.5)
    assert torch.accel.synchronize() is None  # nothing left to fail
    # float8 is floating point, but has no type promotion: the CPU's native_dropout refuses it
    # at the call (the one-task dropout failed later on the stream, at the next synchronize).
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu):
        for device in ("cpu", "accel"):
            x = torch.ones(4, 4, dtype=dtype, device=device)
            with pytest.raises(RuntimeError, match="Promotion for Float8 Types is not supported"):
                torch.ops.aten.native_dropout(x, 0.5, True)
        assert torch.accel.synchronize() is None


def test_explicit_generators_and_offsets():
    g = torch.Generator(device="accel")
    assert g.device == torch.device("accel:0")
    g.manual_seed(3)
    assert g.get_offset() == 0
    a = torch.randn(6, device="accel", generator=g).cpu()
    assert g.get_offset() > 0
    g.manual_seed(3)
    assert torch.equal(torch.randn(6, device="accel", generator=g).cpu(), a)
    offset = g.get_offset()
    b = torch.rand(4, device="accel", generator=g).cpu()
    g.set_offset(offset)
    assert torch.equal(torch.rand(4, device="accel", generator=g).cpu(), b)
    g1 = torch.Generator(device="accel:1")
    assert g1.device == torch.device("accel:1")
    with pytest.raises(RuntimeError, match="no tensor is on accel"):
        torch.rand(3, generator=g)  # a CPU tensor with an accel generator, as CUDA refuses


def test_seed_and_fork_rng():
    torch.accel.seed()
    s = torch.accel.initial_seed()
    torch.accel.seed_all()
    assert torch.accel.default_generators[0].initial_seed() == (
        torch.accel.default_generators[1].initial_seed()
    )
    assert isinstance(s, int)
    torch.accel.manual_seed(8)
    with torch.random.fork_rng(devices=range(torch.accel.device_count()), device_type="accel"):
        inside = torch.rand(3, device="accel").cpu()
    assert torch.equal(torch.rand(3, device="accel").cpu(), inside)


def test_graphsafe_states_share_a_generator_state_as_cuda_does():
    g = torch.Generator(device="accel").manual_seed(11)
    shared = g.graphsafe_get_state()
    assert shared.device == torch.device("accel", 0)
    a = torch.rand(4, device="accel", generator=g)
    # The state handed out is g's own: it advanced with g's draw.
    assert shared.get_offset() == g.get_offset() and shared.initial_seed() == 11
    b = torch.rand(4, device="accel", generator=shared)
    ref = torch.Generator(device="accel").manual_seed(11)
    assert torch.equal(a.cpu(), torch.rand(4, device="accel", generator=ref).cpu())
    assert torch.equal(b.cpu(), torch.rand(4, device="accel", generator=ref).cpu())
    # graphsafe_set_state points g at another generator's state, without copying it.
    other = torch.Generator(device="accel").manual_seed(5)
    g.graphsafe_set_state(other.graphsafe_get_state())
    c = torch.rand(4, device="accel", generator=g)
    assert torch.equal(
        c.cpu(),
        torch.rand(
            4, generator=torch.Generator(device="accel").manual_seed(5), device="accel"
        ).cpu(),
    )
    assert other.get_offset() == g.get_offset() > 0
    g.graphsafe_set_state(shared)  # back: shared still holds where g was
    assert g.initial_seed() == 11
    with pytest.raises(RuntimeError, match="expected a generator of an accel device"):
        g.graphsafe_set_state(torch.Generator())
    # clone_state copies instead: the clone advances alone.
    copy = g.clone_state()
    torch.rand(4, device="accel", generator=copy)
    assert copy.get_offset() > g.get_offset()


def test_a_graph_draws_from_the_state_its_generator_points_to_at_replay():
    # torch.compile's graph-safe RNG (partitioners.py) swaps states with graphsafe_set_state
    # between replays; the captured draws must follow the swap.
    helpers.skip_unless_operators_capture()
    g = torch.Generator(device="accel").manual_seed(3)
    graph = torch.accel.AccelGraph()
    with torch.accel.graph(graph):
        u = torch.rand(6, device="accel", generator=g)
    fresh = torch.Generator(device="accel").manual_seed(42)
    g.graphsafe_set_state(fresh.graphsafe_get_state())
    graph.replay()
    expected = torch.rand(
        6, device="accel", generator=torch.Generator(device="accel").manual_seed(42)
    )
    assert torch.equal(u.cpu(), expected.cpu())
    assert fresh.get_offset() > 0  # the replay advanced the state it drew from
