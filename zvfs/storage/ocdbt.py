"""An OCDBT database (tensorstore's Optionally-Cooperative Distributed B+Tree) as a store over
the store that holds it: JAX/Orbax checkpoints, precomputed and Zarr volumes written through
tensorstore's `ocdbt` kvstore driver. The model is that driver, read-only.

`manifest.ocdbt` names the versions; one version (the latest, or the one `-o version=` picks)
is a B+tree whose leaves map each key to its value, inline or as a byte range of a data file
under `d/`. The store shows that version's keys as a flat key space, so every store kind and
view works on top unchanged: a chunk read costs the value's byte range of its data file, after
the B+tree nodes on its path (read once: nodes are cached like shard indexes, in a bounded
CoalescingCache, a bad node cached as its failure).

The version picked at open is the one shown for the life of the mount (a snapshot: tensorstore
writes new versions beside the old ones, and never rewrites a data file); `zvfs refresh` does
not move it. Formats decoding: ocdbt_format.py.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
from bisect import bisect_left

from ..errors import CorruptShardError, MetadataError, ShardChanged
from .base import CountedListing, Entry, Store, Version, listing_budget_of
from .cache import ENTRY_COST, CoalescingCache
from .local import LocalStore
from .ocdbt_format import (BtreeNode, FormatError, Generation, Manifest, Ref, TooLarge, VersionNode, VersionNodeRef, decode_btree_node,
                           decode_manifest, decode_version_node)

log = logging.getLogger("zvfs.ocdbt")

MANIFEST = "manifest.ocdbt"
#: bytes a manifest may take, encoded or decoded: the inline versions (at most 2^16 with the
#: largest arity) and one version node reference per height; tensorstore's are ~300 bytes
MAX_MANIFEST = 16 << 20
#: bytes an encoded or decoded node may take, whatever its database's `max_decoded_node_bytes`
#: says (tensorstore writes nodes of at most that, 8 MiB by default)
MAX_NODE = 64 << 20
#: An Orbax checkpoint (orbax-checkpoint with `use_zarr3`, MaxText's default) holds one Zarr v3
#: array per parameter (`params.dense.kernel/zarr.json`) and no group at its root: such a
#: database is shown under this implicit root group, so that its arrays mount as a hierarchy.
IMPLICIT_ROOT = b'{"zarr_format": 3, "node_type": "group", "attributes": {}}'


class OcdbtStore(Store):
    """The keys of one version of the OCDBT database held by `inner` (at its root)."""

    def __init__(self, inner: Store, manifest: Manifest, generation: Generation, cache_bytes: int):
        self.inner = inner
        self.display = inner.display
        self.listing_budget = listing_budget_of(inner)
        self.manifest = manifest
        self.generation = generation
        self.implicit: dict[str, bytes] = {}  # keys shown that the database does not hold (IMPLICIT_ROOT)
        #: (mode, uid, gid) every node shows, when the store below has them (local): `_stamp`
        self._root: tuple[int, int | None, int | None] | None = None
        self.nodes = CoalescingCache(cache_bytes, patience=inner.patience, name=inner.display)
        config = manifest.config
        self.node_limit = min(MAX_NODE, max(1 << 20, 2 * config.max_decoded_node_bytes))
        #: bytes a B+tree node may take, encoded or decoded (`nbytes`): what the node cache
        #: keeps. A larger one is refused unread or as its zstd body inflates past it (EIO for
        #: the keys below it): decoded again for each lookup, a 68 KB leaf of 1,000,001 keys
        #: (1.1 GB/s of zstd) took the daemon to 281 MiB at the mount and 600 MiB under 16
        #: concurrent reads with -o memory=64M (a share of 0.7 MiB).
        self.btree_limit = min(self.node_limit, cache_bytes - ENTRY_COST)

    @property
    def patience(self) -> float:  # type: ignore[override]
        return self.inner.patience

    def root_mode(self) -> tuple[int, int | None, int | None] | None:
        return self._root

    async def directories_changed(self) -> bool:
        """A local database's permission watch: the directories above and in it (the inner
        local store's watch), and the bits `_stamp` folds (its root, manifest, `d/` and data
        files: one listing of `d/` a look), read again; whether they changed. Before, a
        database moved into a 0700 directory, or its `d/` closed, stayed readable to others
        through the mount and `zvfs serve` (an outside attacker). Nothing for remote ones."""
        if not isinstance(self.inner, LocalStore):
            return False
        changed = await self.inner.directories_changed()
        stamp = await _stamp(self.inner)
        if stamp != self._root:
            self._root = stamp
            return True
        return changed

    def forget_directories(self) -> None:
        """`zvfs refresh`: the directories below read again (the bits: at the watch's next look)."""
        if isinstance(self.inner, LocalStore):
            self.inner.forget_directories()

    # -- the B+tree

    async def _node(self, ref: Ref, height: int, where: str, above: bytes, low: bytes, high: bytes | None) -> BtreeNode:
        """The decoded node at `ref`, which its parent says has `height` and keys (full: above
        + prefix + key) in [`low`, `high`) (None: no end), checked as tensorstore does: a node
        pointed at from the wrong place (a sibling's reference) is bad, not a source of missing
        keys. Cached, with the bounds: a node is looked up with the same ones every time."""

        async def load() -> BtreeNode:
            from ..formats.codecs import decode_step  # (in a worker thread when large)

            at = f"{where} ({ref.path} @{ref.offset})"
            hint = "(raise -o memory= or index_cache=)"
            try:
                if ref.length > self.btree_limit:
                    raise CorruptShardError(at, f"B+tree node of {ref.length} bytes, over the limit of {self.btree_limit} {hint}")
                encoded = await _read_exact(self.inner, ref, self.btree_limit, where)
                try:
                    node = await decode_step(decode_btree_node, encoded, ref.base, self.btree_limit)
                except FormatError as e:
                    raise CorruptShardError(at, f"B+tree node: {e}{' ' + hint if isinstance(e, TooLarge) else ''}") from None
                if node.height != height:
                    raise CorruptShardError(at, f"B+tree node of height {node.height} where {height} was expected")
                first, last = above + node.prefix + node.keys[0], above + node.prefix + node.keys[len(node.keys) - 1]
                if first < low:
                    raise CorruptShardError(at, f"B+tree node's first key {first!r} is before {low!r}, where its parent points")
                if high is not None and last >= high:
                    raise CorruptShardError(at, f"B+tree node's last key {last!r} is not before {high!r}, "
                                            "the end its parent gives it")
            except CorruptShardError as e:
                log.error("%s", e)  # once: the cache keeps the failure
                raise
            return node

        return await self.nodes.get(("btree", ref.path, ref.offset, ref.length, height, above, low, high), load)

    @staticmethod
    def _below(node: BtreeNode, i: int, base: bytes, high: bytes | None) -> tuple[Ref, bytes, bytes, bytes | None]:
        """Interior node `node` (its keys' full prefix `base`, its end `high`): child i's
        reference, full prefix, first key and end."""
        end = base + node.keys[i + 1] if i + 1 < len(node.keys) else high
        return node.ref(i), base + node.subtree(i), base + node.keys[i], end

    async def _lookup(self, key: str) -> tuple[BtreeNode, int] | None:
        """The leaf and entry that hold `key`, or None."""
        root = self.generation.root
        if root is None:
            return None
        want = key.encode("utf-8", "surrogateescape")
        ref, height, at, low, high = root, self.generation.height, 0, b"", None
        while True:
            node = await self._node(ref, height, key, want[:at], low, high)
            rest = want[at:]
            if not rest.startswith(node.prefix):
                return None
            rest = rest[len(node.prefix):]
            at += len(node.prefix)
            if height == 0:
                i = node.find(rest)
                return None if i < 0 else (node, i)
            i = node.child(rest)
            if i < 0:
                return None
            common = node.subtree(i)
            if not rest.startswith(common):
                return None
            ref, above, low, high = self._below(node, i, want[:at], high)
            height, at = height - 1, len(above)

    async def _seek(self, ref: Ref, height: int, above: bytes, low: bytes, where: str, first: bytes = b"",
                    high: bytes | None = None) -> tuple[BtreeNode, int, bytes] | None:
        """The leaf, entry and key prefix of the first key >= `low` below `ref` (None: none),
        whose keys are in [`first`, `high`) (`_node`).
        At most two children of a node are tried: past the first, every key is >= `low`."""
        node = await self._node(ref, height, where, above, first, high)
        base = above + node.prefix
        if low <= base:
            i = 0
        elif low.startswith(base):
            rel = low[len(base):]
            i = max(0, node.child(rel)) if height else bisect_left(node.keys, rel)
        else:
            return None  # low is past every key that starts with base
        if height == 0:
            return (node, i, base) if i < len(node.keys) else None
        for j in range(i, len(node.keys)):
            child, below, start, end = self._below(node, j, base, high)
            found = await self._seek(child, height - 1, below, low, where, start, end)
            if found is not None:
                return found
        return None

    # -- the store interface

    def _version(self, node: BtreeNode, i: int) -> Version:
        where = node.location(i)
        if where is None:
            tag: tuple = ("ocdbt-inline", hashlib.blake2b(node.inline(i), digest_size=16).digest())
        else:
            tag = ("ocdbt", *where)
        return Version(node.size(i), tag)

    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        if key in self.implicit:
            return await self.read(key, start, length), await self.current(key)
        found = await self._lookup(key)
        if found is None:
            return None, None
        return await self._value(key, *found, start, length, None, exact=True), self._version(*found)

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        if key in self.implicit:
            value = self.implicit[key][start:]
            return value if length is None else value[:length]
        found = await self._lookup(key)
        if found is None:
            if expect is not None:
                raise ShardChanged(key, "not in this version of the database")
            return None
        if expect is not None and not expect.same(self._version(*found)):
            raise ShardChanged(key)
        return await self._value(key, *found, start, length, extent)

    async def _value(self, key: str, node: BtreeNode, i: int, start: int, length: int | None, extent: int | None,
                     exact: bool = False) -> bytes:
        """Bytes of a value. `exact` (`read_version`: shard indexes): the data file's range is
        read as asked, neither cached nor taken for a step of a walk by the read-ahead below
        (as the suffix read of a shard's index is in a plain store). Measured over nginx with
        the index read as a plain range: reading every chunk file of 4096 64 KiB chunks in
        2048 x 2048 shards took 704 requests against the plain store's 512 (the cached index
        blocks cut the read-ahead windows that cross them)."""
        size = node.size(i)
        begin = max(0, size + start) if start < 0 else min(start, size)
        end = size if length is None else min(size, begin + length)
        where = node.location(i)
        if where is None:
            return node.inline(i)[begin:end]
        if end <= begin:
            return b""
        path, offset = where
        ahead = offset + min(size, extent) if extent else None
        if exact:
            data = (await self.inner.read_version(path, offset + begin, end - begin))[0]
        else:
            data = await self.inner.read(path, offset + begin, end - begin, ahead)
        if data is None or len(data) != end - begin:
            raise CorruptShardError(f"{key} ({path})", f"data file holds {0 if data is None else 'only part of'} "
                                    f"the {end - begin} bytes its B+tree node locates")
        return data

    async def current(self, key: str) -> Version | None:
        if key in self.implicit:
            return Version(len(self.implicit[key]), ("ocdbt-implicit",))
        found = await self._lookup(key)
        return None if found is None else self._version(*found)

    async def size(self, key: str) -> int | None:
        if key in self.implicit:
            return len(self.implicit[key])
        found = await self._lookup(key)
        return None if found is None else found[0].size(found[1])

    async def list(self, prefix: str) -> list[Entry] | None:
        """Names directly below `prefix`, in one pass over the leaves below it that skips each
        subdirectory's keys once its name is seen (a skip past the leaf at hand is one descent
        from the root, through cached nodes)."""
        start = (prefix.strip("/") + "/").encode("utf-8", "surrogateescape") if prefix.strip("/") else b""
        with CountedListing(self.listing_budget, f"{self.display}/{prefix}") as out:
            return await self._list(prefix, start, out)

    async def _list(self, prefix: str, start: bytes, out: CountedListing) -> list[Entry] | None:
        root = self.generation.root
        low = start
        while root is not None:
            found = await self._seek(root, self.generation.height, b"", low, f"{prefix}/")
            if found is None:
                break
            node, i, base = found
            n = len(node.keys)
            while i < n:
                full = base + node.keys[i]
                if full < low:
                    i += 1
                    continue
                if not full.startswith(start):
                    return out.entries() or None
                rest = full[len(start):]
                cut = rest.find(b"/")
                if cut < 0:
                    out.add(rest.decode("utf-8", "surrogateescape"), False, node.size(i))
                    low = full + b"\0"
                else:
                    out.add(rest[:cut].decode("utf-8", "surrogateescape"), True, None)
                    low = start + rest[:cut] + b"0"  # "0" follows "/": past the directory's keys
                i += 1
            low = max(low, base + node.keys[n - 1] + b"\0")
        if not start:
            for name, value in self.implicit.items():
                out.add(name, False, len(value))
        return out.entries() or None

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _read_exact(store: Store, ref: Ref, limit: int, where: str) -> bytes:
    if ref.length > limit:
        raise CorruptShardError(f"{where} ({ref.path} @{ref.offset})", f"node of {ref.length} bytes, over the limit of {limit}")
    data = await store.read(ref.path, ref.offset, ref.length)
    if data is None or len(data) != ref.length:
        raise CorruptShardError(f"{where} ({ref.path})", f"data file holds {'none' if data is None else len(data)} of the "
                                f"{ref.length} bytes at {ref.offset} that the database locates there")
    return data


# ----------------------------------------------------------------------------------- opening


async def open_ocdbt(store: Store, version: str | None, cache_bytes: int) -> OcdbtStore | None:
    """The OCDBT database at the root of `store` (None when it holds no `manifest.ocdbt`), at
    `version`: a generation number, a commit time (ISO 8601: the latest version committed
    then or before), or None for the latest. A bad manifest or a version it does not hold is a
    MetadataError (the mount refuses, one line)."""
    where = f"{store.display}/{MANIFEST}"
    encoded = await store.read(MANIFEST, 0, MAX_MANIFEST + 1)
    if encoded is None:
        return None
    manifest = _decode_manifest(encoded, where)
    if manifest.config.manifest_kind == 1:  # numbered: the versions are in the newest manifest.%016x
        key = await _newest_numbered(store)
        if key is None:
            raise MetadataError(where, "a numbered manifest, and no manifest.<generation> file next to it")
        numbered = await store.read(key, 0, MAX_MANIFEST + 1)
        if numbered is None:
            raise MetadataError(f"{store.display}/{key}", "vanished while being read")
        manifest = _decode_manifest(numbered, f"{store.display}/{key}")
        if manifest.config.manifest_kind != 0:
            raise MetadataError(f"{store.display}/{key}", "holds no versions")
    ocdbt = OcdbtStore(store, manifest, manifest.versions[-1], cache_bytes)
    if version is not None:
        ocdbt.generation = await _pick(ocdbt, version, where)
    if await _arrays_without_root(ocdbt):
        ocdbt.implicit["zarr.json"] = IMPLICIT_ROOT
    ocdbt._root = await _stamp(store)
    g = ocdbt.generation
    log.info("%s: OCDBT database, generation %d of %d (committed %s)", store.display, g.number,
             manifest.versions[-1].number, _when(g.commit_ns))
    return ocdbt


async def _stamp(store: Store) -> tuple[int, int | None, int | None] | None:
    """The bits, owner and group the database's keys show (None: the store below has none,
    remote): the root directory's, less the read bits a reader lacks on `manifest.ocdbt`, the
    `d` directory or any data file in it (a key's value may be in any of them, and which one is
    not known without its B+tree path), so that nothing is shown wider than the store
    (docs/reliability.md, Permissions; an outside attacker read every chunk of a database whose
    data files were 0600)."""
    root = await store.info("")
    if root is None or root.mode is None:
        return None
    mode = root.mode

    def narrow(bits: int) -> None:
        nonlocal mode
        read = bits & 0o444
        mode &= read | (read >> 2)  # a read bit missing closes the directories to that reader too

    for key in (MANIFEST, "d"):
        entry = await store.info(key)
        if entry is not None and entry.mode is not None:
            narrow(entry.mode)
    for entry in await store.list("d") or ():
        if not entry.is_dir and entry.mode is not None:
            narrow(entry.mode)
    return mode, root.uid, root.gid


async def _arrays_without_root(ocdbt: OcdbtStore) -> bool:
    """Whether the database holds Zarr v3 nodes one level down and nothing at its root that a
    store kind is recognised by (an Orbax checkpoint). Its first 8 directories are looked at."""
    if await ocdbt.size("zarr.json") is not None or await ocdbt.size("info") is not None:
        return False
    dirs = [e.name for e in await ocdbt.list("") or [] if e.is_dir][:8]
    return any([await ocdbt.size(f"{d}/zarr.json") is not None for d in dirs])


def _decode_manifest(encoded: bytes, where: str) -> Manifest:
    if len(encoded) > MAX_MANIFEST:
        raise MetadataError(where, f"larger than {MAX_MANIFEST >> 20} MiB")
    try:
        return decode_manifest(encoded, MAX_MANIFEST)
    except FormatError as e:
        raise MetadataError(where, f"not a valid OCDBT manifest: {e}") from None


async def _newest_numbered(store: Store) -> str | None:
    names = [e.name for e in await store.list("") or [] if re.fullmatch(r"manifest\.[0-9a-f]{16}", e.name)]
    return max(names) if names else None


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).isoformat(timespec="seconds")


def parse_version(text: str) -> int | float:
    """`-o version=`: a generation number (int), or a commit time (float, seconds since the
    epoch) written in ISO 8601 (`2026-11-26T01:02:03Z`; no zone: UTC)."""
    if text.isdigit():
        return int(text)
    when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


async def _pick(ocdbt: OcdbtStore, text: str, where: str) -> Generation:
    """The generation `-o version=` names: by number, or the latest committed at or before a
    time; looked up in the manifest's inline versions, then down the version tree."""
    try:
        wanted = parse_version(text)
    except ValueError:
        raise MetadataError(where, f"-o version={text}: neither a generation number nor an ISO 8601 time") from None
    manifest = ocdbt.manifest
    by_number = isinstance(wanted, int)
    ns = 0 if by_number else int(wanted * 1e9)

    def fits(g: Generation) -> bool:
        return g.number == wanted if by_number else g.commit_ns <= ns

    newest = manifest.versions[-1].number
    found = [g for g in manifest.versions if fits(g)]
    if found:  # the inline versions are the newest: the last that fits is the one
        return found[-1]
    children = list(manifest.version_nodes)
    try:
        while children:
            if by_number:
                child = next((c for c in children if c.last >= wanted), None)  # type: ignore[operator]
            else:
                child = next((c for c in reversed(children) if c.earliest_ns <= ns), None)
            if child is None:
                break
            node = await _version_node(ocdbt, child)
            if node.height == 0:
                found = [g for g in node.leaves if fits(g)]
                break
            children = list(node.children)
    except CorruptShardError as e:
        raise MetadataError(where, f"version tree: {e}") from None
    if found:
        return found[-1]
    what = f"no generation {wanted}" if by_number else f"no version committed at or before {text}"
    raise MetadataError(where, f"-o version={text}: {what} (the newest is generation {newest}, committed "
                        f"{_when(manifest.versions[-1].commit_ns)})")


async def _version_node(ocdbt: OcdbtStore, child: VersionNodeRef) -> VersionNode:
    ref = child.ref
    encoded = await _read_exact(ocdbt.inner, ref, ocdbt.node_limit, "version tree")
    try:
        node = decode_version_node(encoded, ref.base, ocdbt.manifest.config.arity_log2, ocdbt.node_limit)
    except FormatError as e:
        raise CorruptShardError(f"version tree ({ref.path} @{ref.offset})", str(e)) from None
    if node.height != child.height:
        raise CorruptShardError(f"version tree ({ref.path} @{ref.offset})", f"height {node.height}, expected {child.height}")
    return node
