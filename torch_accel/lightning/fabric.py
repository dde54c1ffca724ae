"""accel's accelerator and strategies for ``lightning.fabric`` (see the package's notes)."""

from torch_accel.lightning import _fabric

classes = _fabric.build("lightning.fabric", __name__)
AccelAccelerator = classes.AccelAccelerator
SingleAccelStrategy = classes.SingleAccelStrategy
DDPAccelStrategy = classes.DDPAccelStrategy
