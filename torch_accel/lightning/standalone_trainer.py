"""accel's accelerator and strategies for the standalone ``pytorch_lightning``."""

from torch_accel.lightning import _trainer, standalone_fabric

classes = _trainer.build("pytorch_lightning", standalone_fabric.classes, __name__)
AccelAccelerator = classes.AccelAccelerator
SingleAccelStrategy = classes.SingleAccelStrategy
DDPAccelStrategy = classes.DDPAccelStrategy
