"""accel's accelerator and strategies for ``lightning.pytorch`` (see the package's notes)."""

from torch_accel.lightning import _trainer, fabric

classes = _trainer.build("lightning.pytorch", fabric.classes, __name__)
AccelAccelerator = classes.AccelAccelerator
SingleAccelStrategy = classes.SingleAccelStrategy
DDPAccelStrategy = classes.DDPAccelStrategy
