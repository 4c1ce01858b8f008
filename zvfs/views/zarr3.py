"""The unsharded Zarr v3 view: of a Zarr v3 hierarchy (`Zarr3View`), and of the array model
of any other store kind (`ModelZarr3View`).

Of a Zarr store: groups, attributes and unsharded arrays are shown as stored. A sharded array
becomes a directory with a rewritten `zarr.json` (two fields change: the chunk shape becomes
the innermost chunk shape, the codecs become the transposes before sharding plus the inner
codecs) and one file per non-empty innermost chunk, named by the array's own
`chunk_key_encoding`. The chunk files' bytes are the inner chunks' bytes, unchanged.

Of another kind (precomputed volume scales): a clean Zarr v3 hierarchy written from the model,
`zarr.json` per group and array (default chunk keys `c/0/4/1`), chunk bytes passed through
where the stored chunk is the Zarr chunk and edge chunks padded (views/transcode.py).
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from ..formats.array import ArrayModel, GroupModel, Hierarchy
from ..formats.codecs import Chain, fill_value_json, undecodable
from ..formats.zarr3 import (
    META,
    ArrayNode,
    ChunkKeyEncoding,
    GroupNode,
    ShardedArray,
    child_path,
    parse_array,
)
from ..storage.base import Entry, Store
from ..storage.cache import CoalescingCache
from ..tree.nodes import (
    BytesFile,
    Dir,
    Node,
    PassDir,
    RangeFile,
    Rows,
    Stamp,
    Tree,
    stamp_of,
)
from .chunks import ChunkSpace, Layout
from .hierarchy import HierarchyView, NotExpressible
from .transcode import Encoding, zarr_encoding

log = logging.getLogger("zvfs.view.zarr3")


def metadata_bytes(meta: dict) -> bytes:
    """Serialise metadata the way zarr-python writes it (2-space indent): an array's fill
    value in the spec's form (a bare NaN token, which zarrita 0.2.7 writes, becomes "NaN").
    Other NaN and Infinity values (attributes: zarr-python writes `attrs["scale"] = nan` as a
    bare NaN token) stay the bare tokens they were, which zarr-python reads back; as strict
    JSON they were a ValueError, and the array EIO with a traceback."""
    if meta.get("node_type") == "array" and "fill_value" in meta:
        try:
            meta = {**meta, "fill_value": fill_value_json(meta["data_type"], meta["fill_value"], 3)}
        except (ValueError, TypeError, KeyError):
            pass  # a data type zarr does not know: kept as written
    return json.dumps(meta, indent=2).encode()


def unsharded_metadata(node: ArrayNode) -> dict:
    """The `zarr.json` of the unsharded equivalent of a sharded array (key order kept)."""
    assert node.plan is not None
    meta = dict(node.meta)
    grid = dict(meta["chunk_grid"])
    grid["configuration"] = {**grid.get("configuration", {}), "chunk_shape": list(node.plan.chunk_shape)}
    meta["chunk_grid"] = grid
    meta["codecs"] = node.plan.codecs
    return meta


def unsharded_group_metadata(meta: dict, where: str) -> dict:
    """A group's `zarr.json` with its consolidated array entries rewritten like the arrays
    themselves; otherwise zarr-python would read inner chunks as shards."""
    cm = meta.get("consolidated_metadata")
    if not isinstance(cm, dict) or not isinstance(cm.get("metadata"), dict):
        return meta
    entries = {}
    for path, m in cm["metadata"].items():
        if isinstance(m, dict) and m.get("node_type") == "array":
            node = parse_array(path, m, f"{where} (consolidated entry {path!r})")
            if node.plan is not None:
                m = unsharded_metadata(node)
        entries[path] = m
    return {**meta, "consolidated_metadata": {**cm, "metadata": entries}}


class Zarr3View:
    """Builds the view's tree lazily from a loaded hierarchy."""

    def __init__(self, store: Store, nodes: dict[str, ArrayNode | GroupNode], cache: CoalescingCache,
                 listings: CoalescingCache | None = None, arrays: Hierarchy | None = None, dirs: dict[str, Entry] | None = None):
        self.store = store
        self.nodes = nodes
        self.cache = cache
        self.arrays = arrays or {}
        self.dirs = dirs or {}  # store directory -> its entry (owner, bits, time)
        self.tree = Tree(listings)
        #: extra virtual children of a group (by group path): ZVF's `objects/`
        self.extras: Callable[[str], list[tuple[str, Node]]] = lambda path: []
        self.node_for("")

    def node_for(self, path: str) -> Node:
        def make(ino: int) -> Node:
            h = self.nodes[path]
            if isinstance(h, GroupNode):
                return GroupDir(ino, self, h)
            if h.plan is not None:
                model = self.arrays.get(path)
                chunks = model.chunks if isinstance(model, ArrayModel) and isinstance(model.chunks, ShardedArray) else None
                return ShardedArrayDir(ino, self, chunks or ShardedArray(h, self.store, self.cache))
            return ShownPassDir(ino, self, path)

        return self.tree.intern(("zarr", path), make)

    def stamp(self, path: str) -> Stamp:
        """What a directory shown for store directory `path` shows: that directory's."""
        return stamp_of(self.dirs.get(path))

    def metadata_file(self, path: str, meta: dict) -> BytesFile:
        source = self.nodes[path].version
        return self.tree.intern(("meta", path), lambda ino: BytesFile(ino, metadata_bytes(meta), source, self.store,  # type: ignore[return-value]
                                                                      child_path(path, META)))


class ShownPassDir(PassDir):
    """A store directory the view shows as it is (an array without sharding), with the bits
    the view holds for it now (`Zarr3View.stamp`: read again when permissions change)."""

    __slots__ = ("view", "path")

    def __init__(self, ino: int, view: Zarr3View, path: str):
        super().__init__(ino, view.tree.store_dir(view.store, path))
        self.view = view
        self.path = path

    def stamp(self) -> Stamp:
        return self.view.stamp(self.path)


class GroupDir(Dir):
    """A group: its own (possibly rewritten) `zarr.json`, its child nodes, and whatever else
    the store holds there, shown as stored."""

    __slots__ = ("view", "group")

    def __init__(self, ino: int, view: Zarr3View, group: GroupNode):
        super().__init__(ino)
        self.view = view
        self.group = group

    def stamp(self) -> Stamp:
        return self.view.stamp(self.group.path)

    def _meta_file(self) -> Node:
        view, group = self.view, self.group
        meta = unsharded_group_metadata(group.meta, f"{view.store.display}/{child_path(group.path, META)}")
        if meta is group.meta:  # nothing to rewrite: the stored bytes, unchanged
            return view.tree.intern(("meta", group.path), lambda ino: BytesFile(ino, group.raw, group.version, view.store,
                                                                                child_path(group.path, META)))
        return view.metadata_file(group.path, meta)

    async def lookup(self, name: str) -> Node | None:
        """Metadata and child nodes are known from the hierarchy: no listing needed."""
        if name == META:
            return self._meta_file()
        if name in self.group.children:
            return self.view.node_for(child_path(self.group.path, name))
        found = await self.view.tree.store_dir(self.view.store, self.group.path).lookup(name)
        return found if found is not None else dict(self.view.extras(self.group.path)).get(name)

    async def entries(self) -> list[tuple[str, Node]]:
        view, path = self.view, self.group.path
        store_dir = view.tree.store_dir(view.store, path)
        listing = await store_dir.listing()
        out: list[tuple[str, Node]] = []
        for i, name in enumerate(listing.names if listing is not None else []):
            if name == META and not listing.is_dir[i]:  # type: ignore[union-attr]
                out.append((name, self._meta_file()))
            elif name in self.group.children:
                out.append((name, view.node_for(child_path(path, name))))
            else:
                out.append((name, store_dir.child(listing, i)))  # type: ignore[arg-type]
        taken = {name for name, _ in out}
        out += [(name, node) for name, node in view.extras(path) if name not in taken]
        return sorted(out, key=lambda e: e[0])


class ShardedArrayDir(Dir):
    """A sharded array shown unsharded: `zarr.json` plus the chunk key tree."""

    __slots__ = ("view", "array", "chunks")

    def __init__(self, ino: int, view: Zarr3View, array: ShardedArray):
        super().__init__(ino)
        self.view = view
        self.array = array
        layout = Layout.zarr(array.node.encoding, array.ndim)
        path = array.node.path
        chunk_dir = child_path(path, layout.top) if layout.top else path
        self.chunks = ChunkSpace(view.tree, array, layout, lambda ino, ref, coords: RangeFile(ino, array.store, ref), plain=True,
                                 stamp=lambda: view.stamp(chunk_dir if chunk_dir in view.dirs else path), where=path,
                                 store=view.store)

    def stamp(self) -> Stamp:
        return self.view.stamp(self.array.node.path)

    def _meta(self) -> BytesFile:
        return self.view.metadata_file(self.array.node.path, unsharded_metadata(self.array.node))

    async def lookup(self, name: str) -> Node | None:
        if name == META:
            return self._meta()
        return await self.chunks.top_lookup(name)

    async def entries(self) -> list[tuple[str, Node]]:
        return sorted([(META, self._meta()), *await self.chunks.top_entries()], key=lambda e: e[0])

    async def rows(self) -> Rows:
        rows = await self.chunks.top_rows()
        meta = self._meta()
        rows.add(META, meta.ino, False, meta.known_size(), meta.stamp(), meta.token())
        return rows


class ModelZarr3View(HierarchyView):
    """The Zarr v3 view of a store kind that is not Zarr, written from its array model."""

    name = "zarr"

    def encoding(self, node: ArrayModel) -> Encoding:
        if node.warning:
            raise NotExpressible(node.warning)
        chain = Chain.parse(node.codecs, node.data_type, node.ndim)
        if chain is None:
            raise NotExpressible(undecodable(node.codecs, node.data_type))
        return zarr_encoding(self.name, node, chain)

    def group_files(self, group: GroupModel) -> dict[str, bytes]:
        meta = {"zarr_format": 3, "node_type": "group", "attributes": group.attributes}
        return {META: metadata_bytes(meta)}

    def array_files(self, node: ArrayModel) -> dict[str, bytes]:
        meta = {
            "zarr_format": 3, "node_type": "array", "shape": list(node.shape), "data_type": node.data_type,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(node.chunk_shape)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": node.fill_value if node.fill_value is not None else 0, "codecs": node.codecs,
            "attributes": node.attributes,
        }
        if node.dimension_names is not None:
            meta["dimension_names"] = list(node.dimension_names)
        return {META: metadata_bytes(meta)}

    def layout(self, node: ArrayModel) -> Layout:
        return Layout.zarr(ChunkKeyEncoding("default", "/"), node.ndim)
