"""Lightning's Trainer and Fabric on accel (torch_accel/lightning), against the CPU.

torch_accel registers the "accel" accelerator and the "single_accel" and "ddp_accel" strategies
in Lightning's registries once Lightning is imported. Lightning's own choices for devices it does
not list (the CPU for one device, torch.cuda streams under DDP, CUDA autocast for mixed
precision) are refused with an error that names accel's strategies, or replaced.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")
from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402
from lightning.pytorch.accelerators import AcceleratorRegistry  # noqa: E402
from lightning.pytorch.strategies import StrategyRegistry  # noqa: E402

from torch_accel.lightning import trainer as accel_trainer  # noqa: E402


@pytest.fixture(autouse=True)
def _lightnings_process_state() -> object:
    """Lightning changes the process as CUDA users expect: the accelerator makes the device it
    sets up current (as torch.cuda.set_device), and its launchers and seeding set environment
    variables (MASTER_PORT, PL_GLOBAL_SEED). Restored after each test for the tests after."""
    device = torch.accel.current_device()
    environ = dict(os.environ)
    yield
    torch.accel.set_device(device)
    os.environ.clear()
    os.environ.update(environ)


QUIET = dict(
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
)


class Regressor(L.LightningModule):
    """A small MLP that records, for each training step, its output's device and dtype and
    whether accel's autocast was on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1))
        self.seen: list[tuple[torch.device, torch.dtype, bool]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        out = self.net(x)
        self.seen.append((out.device, out.dtype, torch.is_autocast_enabled("accel")))
        self.log("autocast", float(torch.is_autocast_enabled("accel")))
        if torch.distributed.is_initialized():
            self.log("accl", float(torch.distributed.get_backend() == "accl"))
        return nn.functional.mse_loss(out.float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def _loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(64, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def _fit(module: Regressor, **flags: object) -> L.Trainer:
    trainer = L.Trainer(max_epochs=2, **QUIET, **flags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's notes on workers and deprecated pytrees
        trainer.fit(module, _loader())
    return trainer


def _trained(**flags: object) -> tuple[Regressor, L.Trainer]:
    torch.manual_seed(0)
    module = Regressor()
    return module, _fit(module, **flags)


def _assert_same_parameters(a: nn.Module, b: nn.Module, **tolerance: float) -> None:
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu(), msg=name, **tolerance)


def test_accel_is_in_lightnings_registries() -> None:
    assert "accel" in AcceleratorRegistry.available_accelerators()
    for name in ("single_accel", "ddp_accel", "ddp_spawn_accel", "ddp_fork_accel"):
        assert name in StrategyRegistry.available_strategies()
    from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
    from lightning.fabric.strategies import STRATEGY_REGISTRY

    assert "accel" in ACCELERATOR_REGISTRY.available_accelerators()
    assert "single_accel" in STRATEGY_REGISTRY.available_strategies()


LIGHTNING_FIRST = """
import sys

class Watch:
    # Lightning modules imported (first found) while accel's classes are being made.
    found = []

    def find_spec(self, name, path, target=None):
        frame = sys._getframe(1)
        while frame is not None:
            if "torch_accel/lightning" in frame.f_code.co_filename:
                if name.split(".")[0] in ("lightning", "lightning_fabric", "pytorch_lightning"):
                    self.found.append(name)
                break
            frame = frame.f_back
        return None

sys.meta_path.insert(0, Watch())
import {package}
import torch_accel
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry
from pytorch_lightning.strategies import StrategyRegistry as StandaloneStrategies
print("accel" in ACCELERATOR_REGISTRY, "ddp_accel" in STRATEGY_REGISTRY,
      "accel" in AcceleratorRegistry, "single_accel" in StrategyRegistry,
      "ddp_spawn_accel" in StandaloneStrategies, Watch.found)
"""


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_registration_waits_for_lightnings_registries(run_python, package: str) -> None:
    """A program that imports Lightning before torch: Lightning imports torch (and through its
    autoload torch_accel) halfway through its own modules. accel registers once Lightning has
    imported the registries, and imports none of Lightning's modules itself (registering as
    torch_accel loads imported them in the middle of Lightning's own imports)."""
    result = run_python(LIGHTNING_FIRST.format(package=package))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True"] * 5 + ["[]"]


def test_trainer_trains_on_the_chosen_accel_device_as_on_the_cpu() -> None:
    cpu, _ = _trained(accelerator="cpu", devices=1)
    accel, trainer = _trained(accelerator="accel", strategy="single_accel", devices=[1])
    assert trainer.strategy.root_device == torch.device("accel", 1)
    assert {s[:2] for s in accel.seen} == {(torch.device("accel", 1), torch.float32)}
    assert len(accel.seen) == len(cpu.seen) == 8
    _assert_same_parameters(cpu, accel, rtol=1e-5, atol=1e-6)


def test_trainer_mixed_precision_autocasts_accel() -> None:
    """Lightning's connector makes its MixedPrecision plugin for "cuda"; accel's accelerator
    swaps in one for accel, so steps run under accel's autocast as they do on the CPU."""
    cpu, _ = _trained(accelerator="cpu", devices=1, precision="bf16-mixed")
    accel, trainer = _trained(
        accelerator="accel", strategy="single_accel", devices=1, precision="bf16-mixed"
    )
    assert trainer.precision_plugin.device == "accel"
    assert {s for s in accel.seen} == {(torch.device("accel", 0), torch.bfloat16, True)}
    assert {s[1] for s in cpu.seen} == {torch.bfloat16}
    _assert_same_parameters(cpu, accel, rtol=2e-2, atol=2e-3)


def test_trainer_device_stats_are_accels_memory_stats() -> None:
    x = torch.ones(1024, device="accel")
    stats = accel_trainer.AccelAccelerator().get_device_stats(x.device)
    assert stats["allocated_bytes.all.current"] == torch.accel.memory_allocated()
    assert stats["allocated_bytes.all.current"] >= x.nbytes


def test_one_device_without_accels_strategy_says_which_to_use() -> None:
    """With one device Lightning's automatic strategy puts the model on the CPU for any
    accelerator but CUDA and MPS: accel's accelerator refuses that before the model moves."""
    torch.manual_seed(0)
    with pytest.raises(MisconfigurationException, match="given device cpu.*single_accel"):
        _fit(Regressor(), accelerator="accel", devices=1)


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (3, "devices=3: there are 2 accel devices"),
        ([0, 0], "names a device twice"),
        ([2], r"devices 0 to 1, not \[2\]"),
        (0, "not a valid input using accel"),  # Lightning's own check
        ("one", "not a count"),
    ],
)
def test_bad_devices_flags_raise_naming_the_flag(devices: object, message: str) -> None:
    with pytest.raises(MisconfigurationException, match=message):
        L.Trainer(accelerator="accel", strategy="single_accel", devices=devices, **QUIET)


def test_devices_flags_select_accel_indices() -> None:
    parse = accel_trainer.AccelAccelerator.parse_devices
    assert parse(1) == [0]
    assert parse(-1) == [0, 1]
    assert parse("2") == [0, 1]
    assert parse("1,0") == [1, 0]
    assert parse([1]) == [1]
    assert accel_trainer.AccelAccelerator.get_parallel_devices([1]) == [torch.device("accel", 1)]


def test_single_accel_with_several_devices_says_what_to_pass() -> None:
    with pytest.raises(MisconfigurationException, match="one accel device.*gives? 2"):
        L.Trainer(accelerator="accel", strategy="single_accel", **QUIET)  # devices="auto": 2


def test_lightnings_ddp_strategies_are_refused_for_accel() -> None:
    """Lightning's DDPStrategy wraps the model on a new torch.cuda.Stream for any device but the
    CPU, which fails on accel; accel's accelerator names the strategies to use instead."""
    trainer = L.Trainer(accelerator="accel", devices=2, strategy="ddp_spawn", **QUIET)
    with pytest.raises(MisconfigurationException, match="torch.cuda.Stream.*'ddp_accel'"):
        trainer.strategy.accelerator.setup(trainer)
    trainer = L.Trainer(
        accelerator="accel", devices=2, strategy="ddp_spawn_accel", precision="bf16-mixed", **QUIET
    )
    assert trainer.precision_plugin.device == "cuda"  # Lightning's choice, until set-up
    trainer.strategy.accelerator.setup(trainer)
    assert trainer.precision_plugin.device == "accel"
    assert trainer.strategy.determine_ddp_device_ids() is None


@pytest.mark.default_only
def test_ddp_over_two_accel_devices_trains_as_one_process() -> None:
    """Both ranks see every batch (no distributed sampler), so averaging their gradients gives
    one process's: DDP over accl on accel:0 and accel:1 trains as the CPU does alone."""
    cpu, _ = _trained(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    accel = Regressor()
    trainer = _fit(
        accel,
        accelerator="accel",
        devices=2,
        strategy="ddp_spawn_accel",
        use_distributed_sampler=False,
    )
    assert trainer.callback_metrics["accl"].item() == 1.0  # rank 0's process group
    assert trainer.callback_metrics["autocast"].item() == 0.0
    _assert_same_parameters(cpu, accel, rtol=1e-5, atol=1e-6)


def _fabric_run(**flags: object) -> tuple[nn.Module, L.Fabric, list[bool]]:
    torch.manual_seed(0)
    fabric = L.Fabric(**flags)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1))
    autocast: list[bool] = []
    model.register_forward_hook(lambda *_: autocast.append(torch.is_autocast_enabled("accel")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    for x, y in fabric.setup_dataloaders(_loader()):
        loss = nn.functional.mse_loss(model(x).float(), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return model, fabric, autocast


def test_fabric_trains_on_accel_as_on_the_cpu() -> None:
    cpu, _, _ = _fabric_run(accelerator="cpu", devices=1)
    accel, fabric, autocast = _fabric_run(accelerator="accel", strategy="single_accel", devices=[1])
    assert fabric.device == torch.device("accel", 1)
    assert {p.device for p in accel.parameters()} == {torch.device("accel", 1)}
    assert autocast == [False] * 4
    _assert_same_parameters(cpu, accel, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_fabric_mixed_precision_autocasts_accel(precision: str) -> None:
    with warnings.catch_warnings():
        # Lightning's connector first makes a CUDA GradScaler for 16-mixed, which warns here.
        warnings.simplefilter("ignore")
        accel, fabric, autocast = _fabric_run(
            accelerator="accel", strategy="single_accel", devices=1, precision=precision
        )
    plugin = fabric.strategy.precision
    assert plugin.device == "accel"
    assert autocast == [True] * 4
    if precision == "16-mixed":
        assert plugin.scaler is not None and plugin.scaler.is_enabled()
        assert plugin.scaler.get_scale() > 0
    fabric_ddp = L.Fabric(accelerator="accel", devices=2, strategy="ddp_accel", precision=precision)
    assert fabric_ddp.strategy.precision.device == "accel"
    assert fabric_ddp.strategy.parallel_devices == [torch.device("accel", i) for i in (0, 1)]


def test_models_move_back_to_the_same_parameters() -> None:
    """The Trainer moves the module to the device and back to the CPU when it ends; the
    Parameter objects stay the ones the module was built with, as with CUDA."""
    torch.manual_seed(0)
    module = Regressor()
    first = dict(module.named_parameters())
    _fit(module, accelerator="accel", strategy="single_accel", devices=1)
    assert all(p is first[name] for name, p in module.named_parameters())


def test_standalone_packages_train_on_accel() -> None:
    """pytorch_lightning and lightning_fabric, the standalone packages, have classes of their
    own; accel registers its own for them too."""
    pl = pytest.importorskip("pytorch_lightning")
    lightning_fabric = pytest.importorskip("lightning_fabric")

    class Standalone(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
            self.autocast: list[bool] = []

        def training_step(self, batch: tuple[torch.Tensor, ...], index: int) -> torch.Tensor:
            self.autocast.append(torch.is_autocast_enabled("accel"))
            return nn.functional.mse_loss(self.net(batch[0]).float(), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(**flags: object) -> Standalone:
        torch.manual_seed(0)
        module = Standalone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pl.Trainer(max_epochs=1, **QUIET, **flags).fit(module, _loader())
        return module

    cpu = fit(accelerator="cpu", devices=1)
    accel = fit(accelerator="accel", strategy="single_accel", devices=[1], precision="bf16-mixed")
    assert accel.autocast == [True] * 4
    _assert_same_parameters(cpu, accel, rtol=2e-2, atol=2e-3)
    fabric = lightning_fabric.Fabric(accelerator="accel", strategy="single_accel", devices=[1])
    assert fabric.device == torch.device("accel", 1)
    assert type(fabric.strategy).__module__ == "torch_accel.lightning.standalone_fabric"
