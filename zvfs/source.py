"""Open a source: pick the store, recognise the store kind, build the requested view.

This is everything `mount`, `ls`, `cat` and `inspect` share; the FUSE adapter only adds the
kernel on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MetadataError
from .formats import zarr3
from .options import MountOptions
from .storage import Store, open_store
from .storage.cache import CoalescingCache
from .tree import Tree
from .views.zarr3 import Zarr3View


@dataclass
class OpenSource:
    store: Store
    kind: str
    view: str
    tree: Tree
    cache: CoalescingCache
    zarr_nodes: dict | None = None


def _index_nbytes(index) -> int:
    return index.entries.nbytes if index is not None else 0


async def open_source(source: str, opts: MountOptions | None = None) -> OpenSource:
    opts = opts or MountOptions()
    store = open_store(source, max_requests=opts.max_requests)
    cache = CoalescingCache(opts.index_cache, _index_nbytes)
    try:
        if await store.read(zarr3.META) is not None:
            view = opts.view or "zarr"
            if view != "zarr":
                raise MetadataError(source, f"view {view!r} is not available for Zarr v3 stores")
            nodes = await zarr3.load_hierarchy(store)
            return OpenSource(store, "zarr3", view, Zarr3View(store, nodes, cache).tree, cache, nodes)
        raise MetadataError(source, "not a recognised store (no zarr.json at its root)")
    except BaseException:
        await store.aclose()
        raise
