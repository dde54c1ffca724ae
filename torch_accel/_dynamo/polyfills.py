"""torch.accel's functions inside torch.compile, as torch.cuda's are: no graph break.

Dynamo knows torch.cuda's device, stream and property functions by name (it folds
``is_available``, ``get_device_properties`` and ``current_device`` into constants and turns
``current_stream``, ``stream`` and ``synchronize`` into graph operations); torch.accel's are a
third-party module's, which Dynamo inlines until they call into ``torch_accel._C``, where it
breaks the graph ("Attempted to call function marked as skipped"; ``fullgraph=True`` fails).
Each is registered with Dynamo through ``torch.compiler.substitute_in_graph``, once Dynamo is
imported:

- constants of the process (device count, properties, names, capabilities, bf16/tf32 support):
  folded, Dynamo calling the real function while it traces (as torch.cuda's);
- the current device, streams and synchronization: traced as the ``torch.accelerator``
  functions Dynamo knows (accel is the process's accelerator), so they are guarded and ordered
  exactly as torch.cuda's are in compiled code.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def _current_device() -> int:
    return torch.accelerator.current_device_index()


def _synchronize(device: Any = None) -> None:
    torch.accelerator.synchronize(device)


def _current_stream(device: Any = None) -> torch.Stream:
    # Dynamo's handler of torch.accelerator.current_stream refuses an explicit None.
    if device is None:
        return torch.accelerator.current_stream()
    return torch.accelerator.current_stream(device)


def _set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


def _stream(stream: torch.Stream | None) -> Any:
    # A torch.Stream is itself the context that makes it current (Dynamo traces it as it traces
    # torch.cuda.stream's); None selects nothing, as torch.accel.stream(None) does.
    return contextlib.nullcontext() if stream is None else stream


def register() -> None:
    """Registers the substitutes (called once Dynamo is imported; see torch_accel/__init__)."""
    from torch.compiler import substitute_in_graph

    accel = torch.accel  # type: ignore[attr-defined]
    for constant in (
        accel.is_available,
        accel.device_count,
        accel.get_device_properties,
        accel.get_device_name,
        accel.get_device_capability,
        accel.is_bf16_supported,
        accel.is_tf32_supported,
    ):
        # Traced only for an argument Dynamo cannot fold (a tensor's device, say): then the
        # function itself is inlined, as without this registration.
        substitute_in_graph(constant, can_constant_fold_through=True, skip_signature_check=True)(
            constant
        )
    for original, substitute in (
        (accel.current_device, _current_device),
        (accel.synchronize, _synchronize),
        (accel.current_stream, _current_stream),
        (accel.set_stream, _set_stream),
        (accel.stream, _stream),
    ):
        substitute_in_graph(original, skip_signature_check=True)(substitute)
