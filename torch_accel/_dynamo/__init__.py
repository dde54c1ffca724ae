"""Dynamo backends of accel: ``torch.compile(model, backend="accel")`` (see backend.py)."""
