"""State kept between requests, behind one interface (``Store``) with two implementations: an
embedded store in a folder of this machine (SQLite, no service) and Redis (shared by replicas).
Live sessions, block lists and trending counts (``live``) keep theirs here."""

from merlin_torch_serving.stores.base import (
    Click,
    Store,
    TrendingCounts,
    TrendingWindow,
    text_key,
)
from merlin_torch_serving.stores.guard import GuardedStore, Outages, Refreshed, ServiceState
from merlin_torch_serving.stores.opening import open_store, shared_store
from merlin_torch_serving.stores.settings import (
    EmbeddedSettings,
    RedisSettings,
    StoreSettings,
    settings_from_config,
    store_settings,
)

__all__ = [
    "Click",
    "EmbeddedSettings",
    "GuardedStore",
    "Outages",
    "RedisSettings",
    "Refreshed",
    "ServiceState",
    "Store",
    "StoreSettings",
    "TrendingCounts",
    "TrendingWindow",
    "open_store",
    "settings_from_config",
    "shared_store",
    "store_settings",
    "text_key",
]
