"""Open a source: pick the store, recognise the store kind, build the requested view.

This is everything `mount`, `ls`, `cat` and `inspect` share; the FUSE adapter only adds the
kernel on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MetadataError
from .formats import precomputed, zarr3, zvf
from .options import MountOptions, storage_options
from .storage import Store, open_store
from .storage.cache import CoalescingCache
from .tree import Tree
from .views.precomputed import PrecomputedView
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


async def open_source(source: str, opts: MountOptions | None = None) -> OpenSource:
    opts = opts or MountOptions()
    protocol = source.split("://", 1)[0] if "://" in source else "file"
    store = open_store(source, max_requests=opts.max_requests, storage_options=storage_options(protocol, opts),
                       readahead=opts.readahead, block_cache=opts.block_cache)
    cache = CoalescingCache(opts.index_cache)
    try:
        if await store.read(zarr3.META) is not None:
            view = _view(source, opts, "zarr", ("zarr",))
            nodes = await zarr3.load_hierarchy(store)
            zview = Zarr3View(store, nodes, cache)
            kind = "zarr3"
            if zvf.is_zvf(nodes):
                kind = "zvf"
                ZvfObjects(zview, CoalescingCache(opts.decoded_cache, len))
            return OpenSource(store, kind, view, zview.tree, cache, zarr_nodes=nodes)
        if await store.read(precomputed.INFO) is not None:
            view = _view(source, opts, "precomputed", ("precomputed",))
            dataset = await precomputed.load_dataset(store)
            decoded = CoalescingCache(opts.decoded_cache, len)
            tree = PrecomputedView(store, dataset, cache, decoded).tree
            return OpenSource(store, "precomputed", view, tree, cache, dataset=dataset)
        raise MetadataError(source, "not a recognised store (no zarr.json or precomputed info at its root)")
    except BaseException:
        await store.aclose()
        raise


def _view(source: str, opts: MountOptions, default: str, allowed: tuple[str, ...]) -> str:
    view = opts.view or default
    if view not in allowed:
        raise MetadataError(source, f"view {view!r} is not available for this store (available: {', '.join(allowed)})")
    return view
