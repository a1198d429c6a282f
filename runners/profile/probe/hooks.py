"""Run a callback right after a module is imported (a post-import hook), without importing it.

The probe and the profiling bootstrap must patch Transformer Engine, ``cp_attention`` and
``torch.distributed`` in a job that imports them *later* (or never): importing TE eagerly would
cost seconds in every process, the torchrun launcher included, and would fail on hosts without
it. A finder at the front of ``sys.meta_path`` wraps the loader of each watched module, so the
callback runs after the module body and before the importer's ``from x import y`` binds names:
a patched attribute is what the user's code gets.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _HookLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks on the executed module."""

    def __init__(self, loader: Any, callbacks: list[Callback]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in list(self._callbacks):
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}
        self._resolving = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callbacks = self.callbacks.get(fullname)
        busy: set[str] = self._resolving.__dict__.setdefault("names", set())
        if not callbacks or fullname in busy:
            return None
        busy.add(fullname)
        try:  # ask the other finders (this one skips itself while resolving)
            spec = importlib.util.find_spec(fullname)
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookLoader(spec.loader, callbacks)
        return spec


_FINDER = _PostImportFinder()
_LOCK = threading.Lock()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    with _LOCK:
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        _FINDER.callbacks.setdefault(name, []).append(callback)
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        callback(module)


def rebind(original: object, replacement: object, *, prefixes: tuple[str, ...]) -> int:
    """Point every module attribute bound to ``original`` at ``replacement``; return how many.

    For a function patched after callers already did ``from module import function``: only
    modules whose name starts with one of ``prefixes`` are scanned (cheap, and never torch's).
    """
    count = 0
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith(prefixes):
            continue
        namespace = getattr(module, "__dict__", {})
        for attr, value in list(namespace.items()):
            if value is original:
                namespace[attr] = replacement
                count += 1
    return count
