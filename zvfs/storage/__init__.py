"""Storage layer: async byte-range reads of keys in a store, and the caches above them."""

from .base import Entry, Store
from .open import open_store, redact

__all__ = ["Entry", "Store", "open_store", "redact"]
