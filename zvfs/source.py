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


async def open_source(source: str, opts: MountOptions | None = None) -> OpenSource:
    opts = opts or MountOptions()
    protocol = source.split("://", 1)[0] if "://" in source else "file"
    store = open_store(source, max_requests=opts.max_requests, storage_options=storage_options(protocol, opts),
                       readahead=opts.readahead, block_cache=opts.block_cache, deadline=opts.retry_deadline,
                       follow_symlinks=opts.follow_symlinks)
    source = store.display  # from here on, only the redacted form is ever shown
    cache = CoalescingCache(opts.index_cache)
    try:
        if await store.read(zarr3.META) is not None:
            view = _view(source, opts, "zarr", ("zarr", "zarr2", "n5"))
            nodes = await zarr3.load_hierarchy(store)
            kind = "zvf" if zvf.is_zvf(nodes) else "zarr3"
            decoded = CoalescingCache(opts.decoded_cache, decoded_size)
            if view == "zarr":
                zview = Zarr3View(store, nodes, cache)
                if kind == "zvf":
                    ZvfObjects(zview, decoded)
                return OpenSource(store, kind, view, zview.tree, cache, zarr_nodes=nodes)
            legacy = Zarr2View(store, nodes, cache, decoded) if view == "zarr2" else N5View(store, nodes, cache, decoded, opts.n5_compression)
            return OpenSource(store, kind, view, legacy.tree, cache, zarr_nodes=nodes, absent=legacy.absent)
        if await store.read(precomputed.INFO) is not None:
            view = _view(source, opts, "precomputed", ("precomputed",))
            dataset = await precomputed.load_dataset(store)
            decoded = CoalescingCache(opts.decoded_cache, decoded_size)
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
