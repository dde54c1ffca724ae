"""Registrations that wait for a module: ``after_import(module, callback)``.

torch_accel registers with some modules only once they are imported, without importing them
itself and without modifying them: a standard import hook (a ``sys.meta_path`` finder that
wraps the one module's loader and calls back right after the module has executed).

Inductor is the reason it exists, and the one place where torch 2.11 leaves no registration
point in time: Inductor picks its decomposition table (and caches a copy of it) when a compile
starts, before it first asks for the PrivateUse1 device's code generators
(``torch.accel.Scheduling``, where torch_accel registers lazily). The operators accel keeps
whole (decompositions.py) must be in that table from the first compile of the process on.
Importing Inductor eagerly with torch_accel would cost every ``import torch_accel`` about 1.5 s,
so torch_accel registers right after Python has imported ``torch._inductor.compile_fx`` instead.

Needed until a backend can hand Inductor its own decomposition table without editing the
global one (pytorch/pytorch#175954, "[RFC] Unify decomposition table usage", open) or be asked
before a compile selects it; test_compile.py checks that the first compile of a process keeps
``native_layer_norm`` whole, and fails once this hook is no longer what makes that happen
(torch_accel._inductor.INDUCTOR_TRIGGER names the module).

Other users wait for Dynamo (torch.accel's substitutes in _dynamo/polyfills.py, _torch_fixes.py's
is_autocast_enabled) and for torchvision (accel's autocast rules for its operators); see
torch_accel/__init__.py.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


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
    def __init__(self, trigger: str) -> None:
        self.trigger = trigger
        self.callbacks: list[Callable[[], None]] = []

    def _run(self) -> None:
        for callback in self.callbacks:
            callback()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.trigger:
            return None
        sys.meta_path.remove(self)  # once: the next lookup uses the other finders
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self._run)
                return spec
        return None


def after_import(trigger: str, callback: Callable[[], None]) -> None:
    """Calls ``callback`` now if module ``trigger`` is imported, else right after its import
    (callbacks waiting for the same module run in the order they were given)."""
    if trigger in sys.modules:
        callback()
        return
    finder = next(
        (f for f in sys.meta_path if isinstance(f, _Finder) and f.trigger == trigger), None
    )
    if finder is None:
        finder = _Finder(trigger)
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(callback)
