"""accel's accelerator and strategies for the standalone ``lightning_fabric``."""

from torch_accel.lightning import _fabric

classes = _fabric.build("lightning_fabric", __name__)
AccelAccelerator = classes.AccelAccelerator
SingleAccelStrategy = classes.SingleAccelStrategy
DDPAccelStrategy = classes.DDPAccelStrategy
