"""The unsharded Neuroglancer precomputed view of a sharded precomputed dataset.

Every `info` loses its `sharding` members; every sharded directory shows the files the
unsharded format has: volume chunks `<x0>-<x1>_<y0>-<y1>_<z0>-<z1>`, skeletons and annotations
`<id>`, multiresolution meshes `<id>.index` + `<id>`, spatial annotation cells `<c0>_<c1>_...`.
gzip `data_encoding` exists only inside shards, so such chunks are served decoded under the
plain names (what tensorstore and cloud-volume read). Everything else is shown as stored, in
every directory: igneous keeps spatial indexes (`*.spatial`), `0.labels.gz`, `*.frags` and
provenance files beside the shards, and cloud-volume's spatial-index queries need them.

In a sharded directory a name is, in this order: the directory's own `info` (rewritten); an
unsharded chunk name (served from the shards only: readers of the original never read a stored
file of that name, so showing one would give them bytes the original does not); a shard file
(`<hex>.shard`, the obsolete `<hex>.index` + `<hex>.data`: hidden); else the stored entry.

Opening a file by name goes straight to its shard and minishard; only listing a directory
reads the minishard indexes of all its shards.
"""

from __future__ import annotations

import heapq
import json
import logging
from typing import Awaitable, Callable, TypeVar

import numpy as np

from ..errors import CorruptShardError, StorageError
from ..formats.chunkref import ChunkRef
from ..formats.precomputed import (
    INFO,
    MAX_DECODED,
    Dataset,
    ShardedDir,
    ShardedKV,
    manifest_fragment_bytes,
    morton_bits,
    morton_decode,
    morton_encode,
    unsharded_info,
    volume_chunk_limit,
)
from ..storage.base import Entry, Store, Version, proof
from ..storage.cache import CoalescingCache
from ..tree.handles import read_ref
from ..tree.nodes import (
    BytesFile,
    Dir,
    InodeRange,
    Node,
    RangeFile,
    Rows,
    Stamp,
    StoreDir,
    Tree,
    stamp_of,
)
from .chunks import parse_coord

log = logging.getLogger("zvfs.view.precomputed")
T = TypeVar("T")


def info_file(tree: Tree, store: Store, path: str, info: dict, source: Version | None = None) -> Node:
    """The info file `path`, rewritten without its sharding members (`source`: the stored
    file's version, whose mode and mtime it shows, followed as the file's bits change)."""
    return tree.intern(("pcinfo", path), lambda ino: BytesFile(ino, json.dumps(unsharded_info(info)).encode(), source,
                                                               store, path))


class PrecomputedView:
    def __init__(self, store: Store, dataset: Dataset, cache: CoalescingCache, decoded: CoalescingCache,
                 listings: CoalescingCache | None = None, dirs: dict[str, Entry] | None = None):
        self.store = store
        self.dataset = dataset
        self.cache = cache
        self.decoded = decoded
        self.dirs = dirs or {}  # store directory -> its entry (owner, bits, time)
        self.tree = Tree(listings)
        self.tree.intern(("pc", ""), lambda ino: DatasetDir(ino, self))

    def sharded_dir(self, sd: ShardedDir) -> Node:
        def make(ino: int) -> Node:
            kv = ShardedKV(self.store, sd.path, sd.spec, self.cache, self.decode_limit(sd))
            if sd.kind in ("volume", "spatial"):
                return MortonDir(ino, self, sd, kv)
            return IdDir(ino, self, sd, kv)

        return self.tree.intern(("pc", sd.path), make)

    def decode_limit(self, sd: ShardedDir) -> int:
        """Output bound of gzip-encoded data in `sd`: a volume chunk's size from its shape and
        type; otherwise (skeletons, meshes, annotations: no size in the metadata) the
        documented cap, kept below the decoded cache so one bomb cannot take the budget."""
        info = self.dataset.info
        if sd.scale is not None:
            return volume_chunk_limit(sd.scale.chunk_size, int(info.get("num_channels", 1) or 1), str(info.get("data_type", "uint64")))
        return min(MAX_DECODED, max(1 << 20, self.decoded.max_bytes))

    def chunk_file(self, ino: int, ref: ChunkRef) -> RangeFile:
        return RangeFile(ino, self.store, ref, self.decoded)


class DatasetDir(Dir):
    """The dataset root: rewritten `info`, sharded directories unsharded, the rest as stored."""

    __slots__ = ("view",)

    def __init__(self, ino: int, view: PrecomputedView):
        super().__init__(ino)
        self.view = view

    def stamp(self) -> Stamp:
        return stamp_of(self.view.dirs.get(""))

    async def lookup(self, name: str) -> Node | None:
        """`info` and the sharded directories are known from the metadata: no listing needed."""
        if name == INFO:
            return info_file(self.view.tree, self.view.store, INFO, self.view.dataset.info, self.view.dataset.versions.get(INFO))
        if name in self.view.dataset.sharded:
            return self.view.sharded_dir(self.view.dataset.sharded[name])
        return await self.view.tree.store_dir(self.view.store, "").lookup(name)

    async def entries(self) -> list[tuple[str, Node]]:
        view = self.view
        store_dir = view.tree.store_dir(view.store, "")
        listing = await store_dir.listing()
        out: list[tuple[str, Node]] = []
        for i, name in enumerate(listing.names if listing is not None else []):
            is_dir = bool(listing.is_dir[i])  # type: ignore[union-attr]
            if name == INFO and not is_dir:
                out.append((name, info_file(view.tree, view.store, INFO, view.dataset.info, view.dataset.versions.get(INFO))))
            elif is_dir and name in view.dataset.sharded:
                out.append((name, view.sharded_dir(view.dataset.sharded[name])))
            else:
                out.append((name, store_dir.child(listing, i)))  # type: ignore[arg-type]
        return out


class ShardedDirNode(Dir):
    """Common part of the sharded directories: the own `info`, the unsharded files (listed
    once), the stored files that are not shards, lookup by name."""

    __slots__ = ("view", "sd", "kv", "stored", "_listing")


    def __init__(self, ino: int, view: PrecomputedView, sd: ShardedDir, kv: ShardedKV):
        super().__init__(ino)
        self.view = view
        self.sd = sd
        self.kv = kv
        self.stored: StoreDir = view.tree.store_dir(view.store, sd.path)
        self._listing: list[tuple[str, Node]] | None = None

    def stamp(self) -> Stamp:
        return stamp_of(self.view.dirs.get(self.sd.path))

    def forget(self) -> None:
        self._listing = None

    def _info(self) -> Node | None:
        if self.sd.info is None:
            return None
        path = f"{self.sd.path}/{INFO}"
        return info_file(self.view.tree, self.view.store, path, self.sd.info, self.view.dataset.versions.get(path))

    def is_shard_file(self, name: str) -> bool:
        """`name` is one of this directory's shard files: the spec's digit count, lower-case
        hex, a shard number that exists under `shard_bits`, as the sharded readers name them."""
        return self.sd.spec.shard_of(name) is not None

    def passes_through(self, name: str) -> bool:
        """A stored entry called `name` is shown as stored (see the module docstring)."""
        if name == INFO and self.sd.info is not None:
            return False
        return self.chunk_key(name) is None and not self.is_shard_file(name)

    async def lookup(self, name: str) -> Node | None:
        if name == INFO and self.sd.info is not None:
            return self._info()
        key = self.chunk_key(name)
        if key is not None:  # no listing needed
            return await self.chunk(key)
        return await self.stored.lookup(name) if self.passes_through(name) else None

    async def unsharded(self) -> list[tuple[str, Node]]:
        """The files the shards hold and the own `info`, sorted (read once, until forgotten)."""
        if self._listing is None:
            ids = await self.kv.all_ids()
            found = [e for e in await self.files_for(ids) if e[1] is not None]
            info = self._info()
            if info is not None:
                found.append((INFO, info))
            self._listing = sorted(found, key=lambda e: e[0])
        return self._listing

    async def _stored(self, read: Callable[[], Awaitable[T]]) -> T | None:
        """`read` of the store directory, or None where the store cannot list it."""
        try:
            return await read()
        except StorageError as e:  # e.g. 403 for a directory on a server without index pages
            log.info("%s: cannot list (%s): only the unsharded files are listed", self.sd.path, e)
            return None

    async def entries(self) -> list[tuple[str, Node]]:
        own = await self.unsharded()
        listing = await self._stored(self.stored.listing)
        if listing is None:
            return own
        stored = [(name, self.stored.child(listing, i)) for i, name in enumerate(listing.names) if self.passes_through(name)]
        return list(heapq.merge(own, stored, key=lambda e: e[0])) if stored else own

    async def rows(self) -> Rows:
        """As `entries`, with the stored part taken from the store directory's rows: no node
        per pass-through entry (igneous leaves one `.frags` per task and a spatial index file
        per cell beside the shards)."""
        own = Rows.of(await self.unsharded())
        stored = await self._stored(self.stored.rows)
        keep = [] if stored is None else [i for i, name in enumerate(stored.names) if self.passes_through(name)]
        if not keep:
            return own
        out = Rows.empty()
        columns = {id(own): own.window(0, len(own)), id(stored): stored.window(0, len(stored))}  # type: ignore[arg-type]
        for _, src, i in heapq.merge(((name, own, i) for i, name in enumerate(own.names)),
                                     ((stored.names[i], stored, i) for i in keep), key=lambda t: t[0]):  # type: ignore[union-attr]
            out.add(*(column[i] for column in columns[id(src)]))
        return out

    def chunk_key(self, name: str):
        """What identifies the unsharded file called `name` in the shards, or None if `name`
        is not an unsharded name of this directory."""
        raise NotImplementedError

    async def chunk(self, key) -> Node | None:
        """The unsharded file `chunk_key` found, or None if the shards do not hold it."""
        raise NotImplementedError

    async def files_for(self, ids: np.ndarray) -> list[tuple[str, Node | None]]:
        raise NotImplementedError


class MortonDir(ShardedDirNode, InodeRange):
    """Volume scales and spatial annotation indexes: chunk ids are compressed Morton codes of
    grid cells, so inode numbers are computed from the code (nothing stored per chunk)."""

    __slots__ = ("grid", "bits", "count", "start")

    def __init__(self, ino: int, view: PrecomputedView, sd: ShardedDir, kv: ShardedKV):
        super().__init__(ino, view, sd, kv)
        self.grid = sd.scale.grid if sd.scale else sd.grid_shape
        self.bits = morton_bits(self.grid)
        self.count = 1 << sum(self.bits)
        self.start = view.tree.reserve(self)

    def name_of(self, cell) -> str:
        return self.sd.scale.chunk_name(cell) if self.sd.scale else "_".join(str(int(c)) for c in cell)

    def parse(self, name: str) -> tuple[int, ...] | None:
        if self.sd.scale:
            return self.sd.scale.parse_chunk_name(name)
        parts = [parse_coord(p) for p in name.split("_")]
        if len(parts) != len(self.grid) or None in parts or any(p >= g for p, g in zip(parts, self.grid)):  # type: ignore[operator]
            return None
        return tuple(parts)  # type: ignore[arg-type]

    async def file(self, code: int) -> Node | None:
        ref = await self.kv.get_ref(code)
        if ref is None:
            return None
        node = self.view.chunk_file(self.start + code, ref)
        node.relocate = lambda: self.kv.get_ref(code)
        return node

    async def node_at(self, offset: int) -> Node | None:
        return await self.file(offset)

    def chunk_key(self, name: str) -> int | None:
        cell = self.parse(name)
        return None if cell is None else morton_encode(cell, self.bits)

    async def chunk(self, key: int) -> Node | None:
        return await self.file(key)

    async def files_for(self, ids: np.ndarray) -> list[tuple[str, Node | None]]:
        ids = ids[ids < np.uint64(self.count)]
        cells = morton_decode(ids, self.bits)
        inside = np.all(cells < np.array(self.grid), axis=1)
        return [(self.name_of(c), await self.file(int(i))) for i, c in zip(ids[inside], cells[inside])]


class IdDir(ShardedDirNode):
    """Skeletons, annotations by id and relationships (`<id>`), and multiresolution meshes
    (`<id>.index`, the manifest, and `<id>`, the fragment data stored right before it)."""

    __slots__ = ()

    @property
    def mesh(self) -> bool:
        return self.sd.kind == "mesh"

    def chunk_key(self, name: str) -> tuple[int, bool] | None:
        """(segment id, whether the file is the whole stored chunk)."""
        is_manifest = self.mesh and name.endswith(".index")
        seg = parse_coord(name[: -len(".index")] if is_manifest else name)
        if seg is None or seg >= 2**64:
            return None
        return seg, is_manifest or not self.mesh

    async def chunk(self, key: tuple[int, bool]) -> Node | None:
        return await self.file(*key)

    async def file(self, seg: int, whole: bool) -> Node | None:
        """The file for segment `seg`: its stored chunk (`whole`), or a mesh's fragment data.
        The node is interned (stable inode number); at open it finds its bytes again, so a
        rewritten shard is read through its new index."""
        ref = await self.ref(seg, whole)
        if ref is None:
            return None
        node = self.view.tree.intern(("pcid", self.sd.path, seg, whole), lambda ino: self.view.chunk_file(ino, ref))
        node.ref = ref  # type: ignore[union-attr]  # (an interned node: located anew)
        node.relocate = lambda: self.ref(seg, whole)  # type: ignore[union-attr]
        return node

    async def ref(self, seg: int, whole: bool) -> ChunkRef | None:
        ref = await self.kv.get_ref(seg)
        if ref is None or whole:
            return ref
        manifest = await read_ref(self.view.store, ref, decode=True)
        frag = manifest_fragment_bytes(manifest, ref.key)
        # data starts after the shard index in a `.shard`, at 0 in an obsolete `.data`
        floor = 0 if ref.key.endswith(".data") else self.kv.spec.shard_index_nbytes
        if frag > ref.offset - floor:
            raise CorruptShardError(ref.key, f"mesh fragments of segment {seg} would start before the shard data")
        evidence = ref.evidence
        if evidence is not None:  # the fragments' place follows from the manifest's bytes too
            stored = await self.view.store.read(ref.key, ref.offset, ref.length, expect=ref.version)
            evidence += (proof(ref.offset, stored or b""),)
        return ChunkRef(ref.key, ref.offset - frag, frag, version=ref.version, evidence=evidence)

    async def files_for(self, ids: np.ndarray) -> list[tuple[str, Node | None]]:
        out: list[tuple[str, Node | None]] = []
        for seg in ids.tolist():
            if self.mesh:
                out.append((f"{seg}.index", await self.file(seg, True)))
                try:
                    out.append((str(seg), await self.file(seg, False)))
                except CorruptShardError:
                    continue  # logged; the manifest stays listed
            else:
                out.append((str(seg), await self.file(seg, True)))
        return out
