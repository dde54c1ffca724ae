"""The ``torch.backends`` entry point of torch_accel: ``import torch`` loads it through here.

A separate top-level module on purpose: loading the entry point must not import the
torch_accel package itself, so that any failure there is caught below instead of breaking
``import torch`` for everyone. When a program imports torch_accel first, torch_accel's own
``import torch`` runs this while torch_accel is half imported; ``import torch_accel`` then
returns the module in progress, which finishes registering afterwards.
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns autoload off.
"""

from __future__ import annotations

import warnings


def autoload() -> None:
    try:
        import torch_accel  # noqa: F401  (registers the device on import)
    except Exception as e:  # noqa: BLE001  (never break import torch)
        warnings.warn(
            f"torch_accel could not be loaded automatically ({type(e).__name__}: {e}); the "
            "'accel' device is unavailable. Set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip "
            "autoloading.",
            RuntimeWarning,
            stacklevel=2,
        )
