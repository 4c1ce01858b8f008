"""Open a source: pick the store, recognise the store kind, build the requested view.

This is everything `mount`, `ls`, `cat` and `inspect` share; the FUSE adapter only adds the
kernel on top.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from importlib.metadata import version
from .errors import MetadataError
from .formats import precomputed, zarr3, zvf
from .options import MountOptions, resolve_caches, storage_options
from .fuse_ops import Control
from .storage import Store, open_store
from .storage.local import LocalStore
from .storage.cache import CoalescingCache, decoded_size
from .tree import Tree
from .views.precomputed import PrecomputedView
from .views.n5 import N5View
from .views.zarr2 import Zarr2View
from .views.zarr3 import Zarr3View
from .views.zvf import ZvfObjects


@dataclass
class OpenSource:
    store: Store
    kind: str
    view: str
    tree: Tree
    cache: CoalescingCache
    zarr_nodes: dict | None = None
    dataset: precomputed.Dataset | None = None
    absent: dict | None = None  # arrays the view cannot express -> why
    decoded: CoalescingCache | None = None
    listings: CoalescingCache | None = None

    @property
    def root_mode(self) -> int | None:
        """Permission bits of a local store's root directory (None for remote stores): no node
        of the mount is shown with wider ones."""
        return os.stat(self.store.root).st_mode & 0o777 if isinstance(self.store, LocalStore) else None

    def caches(self) -> dict[str, CoalescingCache]:
        named = {"index": self.cache, "decoded": self.decoded, "listings": self.listings}
        return {name: cache for name, cache in named.items() if cache is not None}

    def stats(self) -> dict:
        """Live figures of the store and the caches (`zvfs stats`)."""
        out = {"zvfs_version": version("zvfs"), "source": self.store.display, "view": self.view,
               "backend_requests": 0, "backend_bytes": 0, "retries": 0, "caches": {}}
        layer: Store | None = self.store
        while layer is not None:  # the store and the layers it wraps (read coalescing)
            for name, attr in (("backend_requests", "requests"), ("backend_bytes", "bytes"), ("retries", "retries")):
                out[name] = max(out[name], getattr(layer, attr, 0) or 0)
            block = getattr(layer, "cache_stats", None)
            if block is not None:
                out["caches"]["block"] = block()
            layer = getattr(layer, "inner", None)
        for name, cache in self.caches().items():
            out["caches"][name] = {"hits": cache.hits, "misses": cache.misses, "bytes": cache.nbytes}
        return out

    def refresh(self) -> None:
        """`zvfs refresh`: forget every derived cache; indexes and listings are read again."""
        for cache in self.caches().values():
            cache.clear()

    def control(self) -> Control:
        return Control(stats=self.stats, refresh=self.refresh)


async def open_source(source: str, opts: MountOptions | None = None) -> OpenSource:
    opts = resolve_caches(opts or MountOptions())
    protocol = source.split("://", 1)[0] if "://" in source else "file"
    store = open_store(source, max_requests=opts.max_requests, storage_options=storage_options(protocol, opts),
                       readahead=opts.readahead, block_cache=opts.block_cache, deadline=opts.retry_deadline,
                       follow_symlinks=opts.follow_symlinks, request_timeout=opts.request_timeout)
    source = store.display  # from here on, only the redacted form is ever shown
    # the index share of the budget is split between shard indexes and store listings
    cache = CoalescingCache(opts.index_cache // 2)
    listings = CoalescingCache(opts.index_cache // 2, keep_oversized=True)
    try:
        if await store.read(zarr3.META) is not None:
            view = _view(source, opts, "zarr", ("zarr", "zarr2", "n5"))
            nodes = await zarr3.load_hierarchy(store)
            kind = "zvf" if zvf.is_zvf(nodes) else "zarr3"
            decoded = CoalescingCache(opts.decoded_cache, decoded_size)
            if view == "zarr":
                zview = Zarr3View(store, nodes, cache, listings)
                if kind == "zvf":
                    ZvfObjects(zview, decoded)
                return OpenSource(store, kind, view, zview.tree, cache, zarr_nodes=nodes, decoded=decoded, listings=listings)
            legacy = Zarr2View(store, nodes, cache, decoded) if view == "zarr2" else N5View(store, nodes, cache, decoded, opts.n5_compression)
            return OpenSource(store, kind, view, legacy.tree, cache, zarr_nodes=nodes, absent=legacy.absent, decoded=decoded,
                              listings=listings)
        if await store.read(precomputed.INFO) is not None:
            view = _view(source, opts, "precomputed", ("precomputed",))
            dataset = await precomputed.load_dataset(store)
            decoded = CoalescingCache(opts.decoded_cache, decoded_size)
            tree = PrecomputedView(store, dataset, cache, decoded, listings).tree
            return OpenSource(store, "precomputed", view, tree, cache, dataset=dataset, decoded=decoded, listings=listings)
        raise MetadataError(source, "not a recognised store (no zarr.json or precomputed info at its root)")
    except BaseException:
        await store.aclose()
        raise


def _view(source: str, opts: MountOptions, default: str, allowed: tuple[str, ...]) -> str:
    view = opts.view or default
    if view not in allowed:
        raise MetadataError(source, f"view {view!r} is not available for this store (available: {', '.join(allowed)})")
    return view
