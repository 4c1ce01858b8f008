"""Storage layer: async byte-range reads of keys in a store, and the caches above them.

`open.open_store` turns a path or URL into a Store; `urls.redact` says how a source may be
shown. (Not re-exported here: the mount front end imports this package for `redact` alone,
and must not load the stores.)"""

from .base import Entry, Store

__all__ = ["Entry", "Store"]
