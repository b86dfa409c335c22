"""Opening a store from its settings or location, and the one store per settings that the
operators of a process share (one connection pool for every step of a python-backend stub)."""

from __future__ import annotations

import os
import threading
from typing import Any

from merlin_torch_serving.stores.base import Store
from merlin_torch_serving.stores.settings import (
    EmbeddedSettings,
    RedisSettings,
    StoreSettings,
    store_settings,
)

_shared: dict[tuple[int, StoreSettings], Store] = {}
_shared_lock = threading.Lock()


def open_store(location: str | os.PathLike | StoreSettings, **options: Any) -> Store:
    """A store: ``location`` is a Redis URL (``redis://``, ``rediss://``, ``unix://``), a folder
    for the embedded store, or settings; ``options`` are the settings' other fields
    (``password_env``, ``ca_file``, ``timeout_s``, ...). Close it when done (or use ``with``)."""
    settings = store_settings(location, **options)
    if isinstance(settings, RedisSettings):
        from merlin_torch_serving.stores.redis_store import RedisStore

        return RedisStore(settings)
    if isinstance(settings, EmbeddedSettings):
        from merlin_torch_serving.stores.embedded import EmbeddedStore

        return EmbeddedStore(settings)
    raise TypeError(f"not store settings: {settings!r}")


def shared_store(settings: StoreSettings) -> Store:
    """The store of ``settings`` that every caller of this process shares (opened on first use;
    a forked child opens its own)."""
    key = (os.getpid(), settings)
    with _shared_lock:
        store = _shared.get(key)
        if store is None:
            store = _shared[key] = open_store(settings)
        return store
