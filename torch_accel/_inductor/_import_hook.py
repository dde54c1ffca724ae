"""Registers accel with Inductor as soon as Inductor's compiler is imported.

The one place where torch 2.11 leaves no registration point in time: Inductor picks its
decomposition table (and caches a copy of it) when a compile starts, before it first asks for
the PrivateUse1 device's code generators (``torch.accel.Scheduling``, where torch_accel
registers lazily). The operators accel keeps whole (decompositions.py) must be in that table
from the first compile of the process on. Importing Inductor eagerly with torch_accel would cost
every ``import torch_accel`` about 1.5 s, so torch_accel registers right after Python has
imported ``torch._inductor.compile_fx`` instead, through a standard import hook (a
``sys.meta_path`` finder that wraps that one module's loader). Nothing of torch is modified.

Needed until a backend can hand Inductor its own decomposition table without editing the
global one (pytorch/pytorch#175954, "[RFC] Unify decomposition table usage", open) or be asked
before a compile selects it; test_compile.py checks that the first compile of a process keeps
``native_layer_norm`` whole, and fails once this hook is no longer what makes that happen.

``after_import`` serves other registrations that wait for a module too: _torch_fixes.py's with
Dynamo, accel's autocast rules for torchvision's operators (torch_accel/__init__.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_TRIGGER = "torch._inductor.compile_fx"


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, callback: Callable[[], None]) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._callback()


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, trigger: str, callback: Callable[[], None]) -> None:
        self.trigger = trigger
        self._callback = callback

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.trigger:
            return None
        sys.meta_path.remove(self)  # once: the next lookup uses the other finders
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self._callback)
                return spec
        return None


def after_import(trigger: str, callback: Callable[[], None]) -> None:
    """Calls ``callback`` now if module ``trigger`` is imported, else right after its import."""
    if trigger in sys.modules:
        callback()
    elif not any(isinstance(f, _Finder) and f.trigger == trigger for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(trigger, callback))


def _register() -> None:
    from torch_accel._inductor import register

    register()


def install() -> None:
    """Registers now if Inductor's compiler is already imported, else right after its import."""
    after_import(_TRIGGER, _register)
