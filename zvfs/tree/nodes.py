"""The virtual tree: lazy directories, stable inode numbers, exact sizes. No FUSE here.

Two kinds of inode numbers keep memory flat however many chunk files a store has:

- *interned* nodes (groups, arrays, metadata files) get a number on first use and keep it for
  the life of the tree;
- *computed* nodes (chunk directories and chunk files) live in a range of numbers reserved per
  array; a node's number is a function of its grid position, so nothing is stored per chunk
  and the node is rebuilt from its number when the kernel asks for it again;
- entries of directories shown as stored are numbered by their position in the sorted listing,
  in a range reserved for the directory; a name (and kind) keeps its number when the directory
  changes, new names get numbers of their own (`StoreDir`): a number never names another path.

A node says what it shows (`stamp`: bits, time, owner; `token`: which bytes) and opens as a
snapshot (`File.open` -> handles.Handle). Views build their directories from these pieces; the
FUSE front and the `ls`/`cat` commands walk the same tree.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Hashable, Iterable, NamedTuple

import numpy as np
import trio

from ..errors import Gone, ShardChanged, Stale, StorageError
from ..formats.chunkref import ChunkRef
from ..formats.codecs import decode_step
from ..storage.base import MAX_NAME, UNKNOWN_NS, Entries, Entry, Store, Version, usable_name
from ..storage.cache import LISTING_MAX_AGE, CoalescingCache
from .handles import BytesHandle, Handle, PassHandle, RangeHandle, pinned_at, read_ref

log = logging.getLogger("zvfs.tree")

ROOT_INO = 1
RECENT = 4096  # computed nodes kept after a lookup or listing
#: a directory shown as stored is listed again at most once per this many times what its last
#: listing took, when that is more than LISTING_MAX_AGE (an outside attacker: 6 `ls -l` of a
#: directory of 100,000 names that a writer added to every 0.2 s made no progress for 19
#: minutes, the daemon listing it again and again); so at most a tenth of the time
RELIST_SPACING = 10
#: ... but at least this often (seconds): a listing's time is counted on the clock, and on a
#: loaded machine 100,000 names took 15-18 s, so that 4 of 5 files changed in place there did
#: not show their new size within 60 s (2 `ls -l` loops, 3 `ls` loops and a churn run on 2
#: cores; 38-39 s with this bound, the listing taking 23-25 s)
RELIST_MAX_SPACING = 20.0
#: numbers reserved at a time for the names a directory shown as stored gains (a writer adding a
#: file every 0.2 s fills them in about 14 minutes); a directory whose numbers handed out pass
#: twice its size (plus this) is numbered afresh, the old numbers `Stale`
NEW_NAMES_BLOCK = 4096
#: a directory handle that the directory's current listing does not fit beside the ones held
#: gets the newest listing held, if it was current within this many times the time between
#: listings (max(LISTING_MAX_AGE, RELIST_SPACING times what one takes); 100,000 names: ~45 s)
SHARED_MAX_AGE = 3
#: a chunk's shard replaced between its location and its pin this many times running: EIO.
#: (3 gave 2 EIO in ~74,000 opens under a writer replacing the shard every 1 ms: a race
#: repeated three times running about once in 37,000 opens; each more attempt costs only the
#: opens that race, one index read each)
RELOCATE_ATTEMPTS = 8


class Stamp(NamedTuple):
    """What a node shows besides its size: read (and search) bits a reader has, mtime, owner
    and group; None for any of them means the mount's defaults."""

    mode: int | None = None
    mtime_ns: int | None = None
    uid: int | None = None
    gid: int | None = None


NO_STAMP = Stamp()


def stamp_of(what: Version | Entry | None) -> Stamp:
    return NO_STAMP if what is None else Stamp(what.mode, what.mtime_ns, what.uid, what.gid)


class Node:
    __slots__ = ("ino",)
    is_dir = False
    #: seconds the front may let the kernel keep the node's name and attributes (inf: as long
    #: as it likes; nodes shown as stored: as long as their listing stands unchecked)
    kernel_keeps = math.inf

    def __init__(self, ino: int):
        self.ino = ino

    def stamp(self) -> Stamp:
        return NO_STAMP


class File(Node):
    __slots__ = ("relocate",)

    def __init__(self, ino: int):
        super().__init__(ino)
        #: set on chunk files: finds the chunk's bytes again (after its shard changed)
        self.relocate: Callable[[], Awaitable[ChunkRef | None]] | None = None

    def token(self) -> Hashable:
        """Which bytes the file holds as far as this node knows (equal tokens, equal bytes);
        None when that cannot be told."""
        return None

    async def open(self) -> Handle:
        """A snapshot of the file as it is now (the contract: an open sees the version current
        at the open); `Gone` if it is no longer stored."""
        raise NotImplementedError

    async def size(self) -> int:
        raise NotImplementedError

    async def revalidate(self) -> bool:
        """Made current (getattr of a node kept from a lookup or a listing); False: no longer
        stored. Nothing for files that are not chunks of a shard."""
        return True

    def known_size(self) -> int | None:
        """The size if it is known without I/O or decoding, else None (listings use this, so
        listing a directory never decodes its files)."""
        return None

    def bytes_at_hand(self) -> bytes | memoryview | None:
        """All of the file's bytes as `token` names them, if they can be had without waiting
        (to hand them to the kernel's cache before the file is opened), else None; may be a
        view of a store's buffer (`Store.read_now`)."""
        return None


@dataclass(slots=True)
class Rows:
    """A directory listing as the FUSE front serves it: names and attributes, no nodes.
    (Building a node per entry made listings cost 12-15 µs per entry against 2.5 µs for a bare
    pyfuse3 listing; chunk directories compute their rows from the chunk tables instead.)

    `sizes[i]` None: not known without I/O or decoding (the kernel asks getattr later).
    `stamps[i]`: a Stamp; `tokens[i]`: the file's `token` (None for directories).
    `kernel_keeps`: as `Node.kernel_keeps`, for every row."""

    kernel_keeps = math.inf

    names: list[str]
    inos: list[int]
    is_dir: list[bool]
    sizes: list[int | None]
    stamps: list[Stamp]
    tokens: list[Hashable]

    @classmethod
    def empty(cls) -> "Rows":
        return cls([], [], [], [], [], [])

    @classmethod
    def of(cls, entries: list[tuple[str, "Node"]]) -> "Rows":
        rows = cls.empty()
        for name, node in entries:
            if node.is_dir:
                rows.add(name, node.ino, True, 0, node.stamp(), None)
            else:
                rows.add(name, node.ino, False, node.known_size(), node.stamp(), node.token())  # type: ignore[attr-defined]
        return rows

    def add(self, name: str, ino: int, is_dir: bool, size: int | None, stamp: Stamp, token: Hashable) -> None:
        self.names.append(name)
        self.inos.append(ino)
        self.is_dir.append(is_dir)
        self.sizes.append(size)
        self.stamps.append(stamp)
        self.tokens.append(token)

    def __len__(self) -> int:
        return len(self.names)

    def window(self, start: int, stop: int) -> tuple[list, list, list, list, list, list]:
        """Rows [start, stop) as lists: names, inos, is_dir, sizes, stamps, tokens."""
        return (self.names[start:stop], self.inos[start:stop], self.is_dir[start:stop], self.sizes[start:stop],
                self.stamps[start:stop], self.tokens[start:stop])


class Dir(Node):
    __slots__ = ()
    is_dir = True

    async def ready(self) -> None:
        """Learn what `stamp` needs, where that may take I/O (a chunk directory's bits are
        those of the store directories it stands for: views/chunkbits.py); the fronts await
        it before they show a directory."""

    async def rows(self) -> Rows:
        """The listing for the kernel (`entries` without building nodes, where a directory
        can do that); its directories' bits learned first (the kernel holds what it is shown)."""
        entries = await self.entries()
        for _, node in entries:
            if node.is_dir:
                await node.ready()  # type: ignore[attr-defined]
        return Rows.of(entries)

    async def lookup(self, name: str) -> Node | None:
        """The child called `name`, or None. Must not need a listing where avoidable."""
        raise NotImplementedError

    async def entries(self) -> list[tuple[str, Node]]:
        """All children, sorted by name."""
        raise NotImplementedError


class BytesFile(File):
    """A small file held in memory (rewritten metadata, read at mount time: its bytes never
    change); `source` is the version of the file it was rewritten from (its mode and mtime are
    shown: rsync and make see no change across remounts). With `store` and `key` (the file it
    came from), every open and getattr looks at that file again and shows its bits as they are
    now: a `zarr.json` narrowed to 0600 in the store stayed readable to others through the
    mount and `zvfs serve` (an outside attacker). A file gone from the store keeps the last
    bits seen."""

    __slots__ = ("data", "key", "source", "store")

    def __init__(self, ino: int, data: bytes, source: Version | None = None, store: Store | None = None,
                 key: str | None = None):
        super().__init__(ino)
        self.data = data
        self.source = source
        self.store, self.key = store, key

    def stamp(self) -> Stamp:
        return stamp_of(self.source)

    def token(self) -> Hashable:
        return ("bytes", None if self.source is None else self.source.tag)

    async def _follow(self) -> None:
        if self.store is not None:
            now = await self.store.current(self.key)  # type: ignore[arg-type]
            if now is not None:
                self.source = now

    async def revalidate(self) -> bool:
        await self._follow()
        return True

    async def open(self) -> Handle:
        await self._follow()
        return BytesHandle(self.data, self.token())

    async def size(self) -> int:
        return len(self.data)

    def known_size(self) -> int | None:
        return len(self.data)


class RangeFile(File):
    """A file whose bytes are a byte range of a store key (a chunk inside a shard).

    With a decode step (gzip-encoded precomputed chunks) the decoded bytes are what the file
    holds; they are kept in `decoded` (a bounded cache shared by the view) so that the exact
    size and the reads that follow cost one fetch and one decode."""

    __slots__ = ("store", "ref", "decoded")

    def __init__(self, ino: int, store: Store, ref: ChunkRef, decoded: CoalescingCache | None = None):
        self.ino = ino  # (File.__init__'s two assignments without its two calls: one per open)
        self.relocate = None
        self.store = store
        self.ref = ref
        self.decoded = decoded

    def stamp(self) -> Stamp:
        return stamp_of(self.ref.version)

    def token(self) -> Hashable:
        return self.ref.version

    async def open(self) -> Handle:
        """Pin the shard as it is now (one stat locally); the ref stands if the shard is still
        at the version it was located in, and that version was settled (or the ref carries its
        evidence); otherwise the chunk is located anew."""
        ref = self.ref
        pin = self.store.pin_now(ref.key) or await self.store.pin(ref.key)
        if pin is not None and (ref.version is None and ref.offset == 0 and pin.version is not None and ref.length == pin.version.size
                                or ref.version is not None and (pin.version is None or ref.version.same(pin.version))
                                and (ref.version.settled or ref.evidence is not None)):
            return self.handle(pin, ref)
        if pin is not None:
            pin.release()
        return await self.reopen()

    async def revalidate(self) -> bool:
        """The chunk located anew (one stat of its shard, its index from the cache if the shard
        is unchanged): a node the tree kept from a lookup or a listing answered getattr with
        the shard version it was made in, seconds old (an outside attacker's `ls -l` under
        dentry reclaim with a shard renamed over every 4 ms: 0.5-1% of sizes 2-16 s stale, all
        from such nodes). False for a chunk no longer stored (its ref kept: the version open
        handles may still read); its size was the rest of those stale answers (29-98 of
        ~900,000 sizes, 1-11 s old: the chunk gone from its shard's newer versions)."""
        try:
            await self._locate()
        except Gone:
            return False
        return True

    async def reopen(self) -> Handle:
        """The chunk located anew, and opened."""
        return await self.open_located(await self._locate())

    async def _locate(self) -> ChunkRef:
        """The chunk located anew (kept as the file's ref); `Gone` if no longer stored."""
        ref = await self.relocate() if self.relocate is not None else None
        if ref is None:
            raise Gone(self.ref.key)
        self.ref = ref
        return ref

    async def open_located(self, ref: ChunkRef) -> Handle:
        """Open a chunk just located. The pin must hold the version the chunk was located in:
        a local store pins the file the path names when asked, and a shard replaced between
        the index read and the pin would otherwise be read at the old index's offsets with
        its own version checked (another chunk's bytes: the stress test caught 1 read in
        ~14,000). Located again then, a few times, before EIO."""
        for _ in range(RELOCATE_ATTEMPTS):
            pin = await self.store.pin(ref.key, ref.version)
            if pin is None:
                raise Gone(ref.key)
            if pinned_at(pin, ref.version):
                return self.handle(pin, ref)
            pin.release()
            ref = await self._locate()
        raise ShardChanged(ref.key, "replaced while being opened, again and again")

    def handle(self, pin, ref: ChunkRef) -> Handle:
        return RangeHandle(pin, ref, self.decoded, None if ref.decode is not None else ref.length)

    async def _decode(self) -> bytes:
        ref = self.ref
        assert ref.decode is not None and self.decoded is not None

        async def load() -> bytes:
            return await decode_step(ref.decode, await read_ref(self.store, ref))  # type: ignore[arg-type]

        if ref.evidence is not None:
            return await load()
        tag = None if ref.version is None else ref.version.tag
        return await self.decoded.get((ref.key, tag, ref.offset), load)

    async def size(self) -> int:
        if self.ref.decode is not None:
            return len(await self._decode())
        return self.ref.length

    def known_size(self) -> int | None:
        return self.ref.length if self.ref.decode is None else None

    def bytes_at_hand(self) -> bytes | memoryview | None:
        """Read expecting the ref's version (ShardChanged if the shard is another now): pushed
        unchecked, the bytes of a shard replaced since were taken at the old index's offsets
        and recorded as the old version, and a walk read them (an outside attacker's rename
        writer that kept mtimes: 1-4 reads of another chunk's bytes in 40 s; none without the
        push, none with this check)."""
        ref = self.ref
        if ref.decode is not None or not ref.length or ref.version is None or not ref.version.settled:
            return None
        return self.store.read_now(ref.key, ref.offset, ref.length, ref.version)


class PassFile(File):
    """A store key shown as it is. An open pins the key's current version (a replaced or
    rewritten file shows its new size) and reads come from that version."""

    __slots__ = ("store", "key", "entry", "dir")
    kernel_keeps = LISTING_MAX_AGE  # (removed, or replaced by a directory: `StoreDir`)

    def __init__(self, ino: int, store: Store, key: str, entry: Entry | None, store_dir: "StoreDir | None" = None):
        super().__init__(ino)
        self.store = store
        self.key = key
        self.entry = entry
        self.dir = store_dir

    async def revalidate(self) -> bool:
        """The entry of its directory's listing now (at most a second old): a node the tree kept
        from a lookup answered getattr with the size of its file then (an outside attacker: a
        `stat` showed a version of the path 7-12 s old). False when its name no longer numbers
        this node. (Stores that cannot tell cheaply keep their listings: nothing to do.)"""
        if self.dir is None or not self.dir.follows_store:
            return True
        listing = await self.dir.listing()
        i = None if listing is None else listing.numbered_at(self.ino)
        if i is None:
            return False
        self.entry = listing.entry(i)  # type: ignore[union-attr]
        return True

    def stamp(self) -> Stamp:
        return stamp_of(self.entry)

    def token(self) -> Hashable:
        return None if self.entry is None else self.entry.token

    async def open(self) -> Handle:
        pin = await self.store.pin(self.key)
        if pin is None:
            raise Gone(self.key)
        handle = PassHandle(pin)
        v = pin.version
        if v is not None:  # what the next stat shows
            self.entry = Entry(self.key.rpartition("/")[2], False, v.size, v.mode, v.mtime_ns, v.uid, v.gid, handle.token)  # type: ignore[arg-type]
        return handle

    async def size(self) -> int:
        if self.entry is None or self.entry.size is None:  # the listing did not say (HTTP): ask once
            size = await self.store.size(self.key)
            if size is None:  # (an index page links to it, and it is not there: not an empty file)
                raise Gone(self.key)
            self.entry = Entry(self.key.rpartition("/")[2], False, size)
        return self.entry.size  # type: ignore[return-value]

    def known_size(self) -> int | None:
        return None if self.entry is None else self.entry.size


class ListedDir(Dir):
    """A directory whose children are known only by listing; the listing is made once (the
    source is immutable) and lookups are answered from it."""

    __slots__ = ("_entries", "_by_name")

    def __init__(self, ino: int):
        super().__init__(ino)
        self._entries: list[tuple[str, Node]] | None = None
        self._by_name: dict[str, Node] = {}

    async def list_children(self) -> Iterable[tuple[str, Node]]:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop the listing (`zvfs refresh`): the next one asks the store again."""
        self._entries, self._by_name = None, {}

    async def entries(self) -> list[tuple[str, Node]]:
        if self._entries is None:
            self._entries = sorted(await self.list_children(), key=lambda e: e[0])
            self._by_name = dict(self._entries)
        return self._entries

    async def lookup(self, name: str) -> Node | None:
        await self.entries()
        return self._by_name.get(name)



class _Listing:
    """One listing's files in `ListedFiles`, and how they are being opened: `last` is the row
    opened last, `ahead` the first row not yet handed out by `following`, `handed` the files
    handed out and not opened yet (their opens take them: a node costs ~3 us to make)."""

    __slots__ = ("when", "lo", "hi", "inos", "make", "last", "ahead", "handed")

    def __init__(self, inos: np.ndarray, make: Callable[[int, int], "File"]):
        self.when = time.monotonic()
        self.lo, self.hi = int(inos[0]), int(inos[-1])
        self.inos = inos
        self.make = make
        self.last, self.ahead = -1, 0  # (opening row 0 first starts a walk)
        self.handed: dict[int, File] = {}


class ListedFiles:
    """The files of recent listings, by inode number: the kernel opens listed files by number
    right after (`find | xargs cat`, `cp -r` list every directory before the first open), and a
    file a listing just read from its shard index needs no second index lookup (its open still
    checks that the shard is at the version the listing saw).

    One entry per listing (its sorted inode numbers and a function that builds the file of
    one of them), found by bisection on the entries' first numbers; a dense listing is then
    indexed directly. (Scanning the listings cost 69 µs per open with 256 directories listed;
    rebuilding the node from its number, another 6.) Entries older than `fresh` seconds are
    not used, and at most `rows` files are kept: about 200 bytes each with what `make` holds
    (Python lists: reading numpy scalars back cost 0.5 µs more per open), 13 MiB in all. More
    would not help: the opens that use them come within a directory or an `xargs` batch of
    the listing, and `find` runs ahead of `cat` faster than any cap would follow.

    Each entry also follows how its files are opened (`following`): a walk in listing order
    is told from random opens, so that the files it opens next can be pushed ahead."""

    def __init__(self, fresh: float = 5.0, rows: int = 1 << 16):
        self.fresh = fresh
        self.rows = rows
        self._los: list[int] = []  # first numbers of the entries, sorted (their ranges are disjoint)
        self._entries: dict[int, _Listing] = {}  # lo -> entry, oldest first
        self._kept = 0
        self._hit: tuple[int, _Listing | None, int] = (-1, None, 0)

    def add(self, inos: np.ndarray, make: Callable[[int, int], "File"]) -> None:
        """A listing's files: `inos` sorted, `make(ino, i)` the file numbered `inos[i]`."""
        if not len(inos):
            return
        entry = _Listing(inos, make)
        j = bisect.bisect_right(self._los, entry.hi)
        while j > 0 and self._entries[self._los[j - 1]].hi >= entry.lo:  # an older listing of these files
            self._drop(self._los[j - 1])
            j -= 1
        bisect.insort(self._los, entry.lo)
        self._entries[entry.lo] = entry
        self._kept += len(inos)
        while self._kept > self.rows and len(self._entries) > 1:
            self._drop(next(iter(self._entries)))

    def _drop(self, lo: int) -> None:
        self._hit = (-1, None, 0)
        entry = self._entries.pop(lo)
        self._los.remove(lo)
        self._kept -= len(entry.inos)

    def _find(self, ino: int) -> tuple[_Listing | None, int]:
        """The fresh entry listing `ino`, and its row there (the last one found is kept: an
        open asks `get`, then `following`, for the same number)."""
        hit = self._hit
        if hit[0] == ino and time.monotonic() - hit[1].when <= self.fresh:  # type: ignore[union-attr]
            return hit[1], hit[2]
        j = bisect.bisect_right(self._los, ino) - 1
        if j < 0:
            return None, 0
        entry = self._entries[self._los[j]]
        if ino > entry.hi or time.monotonic() - entry.when > self.fresh:
            return None, 0
        inos = entry.inos
        if entry.hi - entry.lo + 1 == len(inos):  # dense: every number from lo to hi is a listed file
            i = ino - entry.lo
        else:
            i = int(inos.searchsorted(ino))
            if i == len(inos) or inos.item(i) != ino:
                return None, 0
        self._hit = (ino, entry, i)
        return entry, i

    def get(self, ino: int) -> "File | None":
        entry, i = self._find(ino)
        if entry is None:
            return None
        return entry.handed.pop(i, None) or entry.make(ino, i)

    def following(self, ino: int, count: int) -> list["File"]:
        """`ino` was just opened: if the opens of its listing walk it in order (`ino` is the
        file after the one opened last: `cp -r`, `find | xargs cat`, an array read in C order),
        the files that walk opens next, up to `count` past `ino`, each handed out once; else
        none (random opens: a loader, a viewer). Past the end of its listing, the walk goes on
        into the listing of the numbers that follow, if it has not been opened yet (a chunk
        directory is listed a few shards at a time: stopping at each listing's end left the
        first file of every one unpushed, a READ request for 1 file in 8 with 8 chunks per
        shard row, 10-30% slower walks of small files)."""
        entry, i = self._find(ino)
        if entry is None:
            return []
        walking, entry.last = i == entry.last + 1, i
        if not walking:
            return []
        out: list[File] = []
        end = i + 1 + count
        self._hand(entry, max(i + 1, entry.ahead), min(end, len(entry.inos)), out)
        if end > len(entry.inos):
            after = self._entries.get(entry.hi + 1)
            if after is not None and after.last == -1 and time.monotonic() - after.when <= self.fresh:
                self._hand(after, after.ahead, min(end - len(entry.inos), len(after.inos)), out)
        return out

    @staticmethod
    def _hand(entry: _Listing, start: int, stop: int, out: list["File"]) -> None:
        """Hand out the files of rows [start, stop) of `entry` (each once)."""
        if start >= stop:
            return
        entry.ahead = stop
        make, inos = entry.make, entry.inos
        handed = entry.handed
        if len(handed) > 64:  # (handed out, never opened)
            handed.clear()
        for r in range(start, stop):
            out.append(make(inos.item(r), r))
            handed[r] = out[-1]

    def clear(self) -> None:
        self._los.clear()
        self._entries.clear()
        self._kept = 0
        self._hit = (-1, None, 0)


class InodeRange:
    """A block of computed inode numbers: `node_at(i)` rebuilds the node numbered start+i."""

    count: int

    async def node_at(self, offset: int) -> Node | None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Listing:
    """One store directory's entries, compact: names plus a few numbers each (about 150 bytes
    per entry; a node per entry kept ~640 bytes each, for good, for a listing of 400,000
    files). Kept in a bounded cache, so listings count against the memory budget. `digest`
    tells one set of names (and kinds) from another; `inos`, the entries' inode numbers
    (`StoreDir.numbered`), and `by_ino`, their positions in number order when that is not
    theirs (None: ascending)."""

    names: list[str]  # sorted
    is_dir: np.ndarray  # bool
    sizes: np.ndarray  # int64, -1: unknown
    modes: np.ndarray  # int32, -1: unknown
    mtimes_ns: np.ndarray  # int64, UNKNOWN_NS: unknown
    owners: np.ndarray  # int64 (n, 2): uid, gid; -1: unknown
    tokens: np.ndarray  # void (n, TOKEN): a file's version token (base.version_token), zeros: unknown
    digest: bytes
    inos: np.ndarray | None = None  # int64
    by_ino: np.ndarray | None = None  # int64

    TOKEN = Entries.TOKEN

    @classmethod
    def of(cls, entries: "list[Entry] | Entries") -> "Listing":
        if not isinstance(entries, Entries):
            columns = Entries()
            for e in entries:
                columns.add(e.name, e.is_dir, e.size, e.mode, e.mtime_ns, e.uid, e.gid, e.token if isinstance(e.token, bytes) else None)
            entries = columns
        # sorted by code point, as Python sorts str (numpy: no Python int per entry, whose memory
        # stays fragmented after a listing of 10^5 files). As objects: a str array is as wide
        # as the longest name, 4 bytes a character, so one name of 255 characters among 200,000
        # took 196 MiB to sort (3 MiB as objects, in 418 ms against 925)
        column = np.array(entries.names, dtype=object)
        order = np.argsort(column, kind="stable") if entries.names else np.zeros(0, np.int64)
        names = column[order].tolist()
        is_dir = np.frombuffer(entries.is_dir, dtype=np.int8)[order].astype(bool)
        digest = hashlib.blake2b(digest_size=16)
        for name, d in zip(names, is_dir.tolist()):
            digest.update(name.encode("utf-8", "surrogateescape") + (b"/\0" if d else b"\0"))
        return cls(names, is_dir,
                   np.frombuffer(entries.sizes, dtype=np.int64)[order],
                   np.frombuffer(entries.modes, dtype=np.int64)[order].astype(np.int32),
                   np.frombuffer(entries.mtimes_ns, dtype=np.int64)[order],
                   np.stack([np.frombuffer(entries.uids, dtype=np.int64), np.frombuffer(entries.gids, dtype=np.int64)], axis=1)[order],
                   np.frombuffer(bytes(entries.tokens), dtype=f"V{cls.TOKEN}")[order],
                   digest.digest())

    def numbered(self, inos: np.ndarray) -> "Listing":
        """This listing, its entries numbered `inos`."""
        ascending = len(inos) < 2 or bool((inos[1:] > inos[:-1]).all())
        return replace(self, inos=inos, by_ino=None if ascending else np.argsort(inos))

    def same_as(self, other: "Listing") -> bool:
        """Whether `other` holds the same entries with the same attributes."""
        return self.digest == other.digest and all(
            np.array_equal(a, b) for a, b in ((self.sizes, other.sizes), (self.modes, other.modes), (self.owners, other.owners),
                                              (self.tokens, other.tokens), (self.mtimes_ns, other.mtimes_ns)))

    @property
    def nbytes(self) -> int:
        return sum(len(n) + 57 for n in self.names) + (53 + self.TOKEN) * len(self.names)

    def find(self, name: str) -> int | None:
        i = bisect.bisect_left(self.names, name)
        return i if i < len(self.names) and self.names[i] == name else None

    def numbered_at(self, ino: int) -> int | None:
        """The position of the entry numbered `ino`, if one is."""
        inos, by_ino = self.inos, self.by_ino
        assert inos is not None
        k = int(np.searchsorted(inos, ino) if by_ino is None else np.searchsorted(inos, ino, sorter=by_ino))
        if k < len(inos):
            i = k if by_ino is None else int(by_ino[k])
            if inos[i] == ino:
                return i
        return None

    def token(self, i: int) -> bytes | None:
        token = self.tokens[i].tobytes()
        return None if not any(token) else token

    def stamp(self, i: int) -> Stamp:
        mode, mtime_ns = int(self.modes[i]), int(self.mtimes_ns[i])
        uid, gid = self.owners[i].tolist()
        return Stamp(None if mode < 0 else mode, None if mtime_ns == UNKNOWN_NS else mtime_ns, None if uid < 0 else uid,
                     None if gid < 0 else gid)

    def entry(self, i: int) -> Entry:
        size = int(self.sizes[i])
        stamp = self.stamp(i)
        return Entry(self.names[i], bool(self.is_dir[i]), None if size < 0 else size, stamp.mode, stamp.mtime_ns,
                     stamp.uid, stamp.gid, self.token(i))


class ListingTooLarge(StorageError):
    """A directory whose listing does not fit the budget of the listings of open directories
    (for a chunk directory: even as a bare record of which positions hold a chunk): EIO for
    the listing (lookups by name still work), one log line naming the option to raise."""


class RowsBudget:
    """The bytes the listings held by open directory handles take, all together (`ChunkRows`
    of chunk directories, `ListingRows` of directories shown as stored): at most the listings
    cache's size, the index share of the `memory` budget that is not shard indexes; and,
    beyond it whatever their size, the listings of one directory shown as stored (`BEYOND`:
    the listings cache keeps one larger than itself too)."""

    #: listings held beyond the budget, all of one directory: its newest beside one that open
    #: handles still hold. (One, held alone: while `ls -l` of a directory of 100,000 names ran,
    #: every `ls` of a directory of 200 names beside it was EIO, 400 of 400 measured, and the
    #: reverse; one of that directory: 6 of 112 `ls -l` of it EIO, two at once under a writer
    #: and a loaded machine, the one held outliving what it may be shared for.)
    BEYOND = 2

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used = 0
        self._beyond: list[int] = []  # ids of the listings held beyond the budget
        self._beyond_of: object = None  # their directory
        self._shared: dict[int, list] = {}  # id(listing) -> [listing, holders, bytes]

    def take(self, nbytes: int) -> bool:
        """Reserve `nbytes` more (a negative number gives back); False, and nothing taken,
        when that would pass the budget."""
        if nbytes > 0 and self.used + nbytes > self.max_bytes:
            return False
        self.used += nbytes
        return True

    def share(self, listing: Listing, of: object) -> bool:
        """Hold `listing` (of directory `of`) once however many handles hold it (an outside
        attacker: 9 of 10 `ls` at once of one directory were EIO, its listing counted once per
        handle), in the budget or else beyond it. False, and nothing held, when it fits neither."""
        held = self._shared.get(id(listing))
        if held is not None:
            held[1] += 1
            return True
        nbytes = listing.nbytes
        if not self.take(nbytes):
            if not self._room_beyond(of):
                return False
            self._beyond.append(id(listing))
            self._beyond_of, nbytes = of, 0
        self._shared[id(listing)] = [listing, 1, nbytes]
        return True

    def _room_beyond(self, of: object) -> bool:
        return not self._beyond or (len(self._beyond) < self.BEYOND and self._beyond_of is of)

    def fits(self, nbytes: int, of: object) -> bool:
        """Whether a listing of `nbytes` of directory `of` would be held now."""
        return self.used + nbytes <= self.max_bytes or self._room_beyond(of)

    def holds(self, listing: Listing) -> bool:
        held = self._shared.get(id(listing))
        return held is not None and held[0] is listing

    def unshare(self, listing: Listing) -> None:
        held = self._shared[id(listing)]
        held[1] -= 1
        if not held[1]:
            del self._shared[id(listing)]
            self.used -= held[2]
            if id(listing) in self._beyond:
                self._beyond.remove(id(listing))


class HeldRows(Rows):
    """Rows that hold bytes of their tree's `RowsBudget` for as long as they live (the
    directory handle that listed them)."""

    def __init__(self, budget: RowsBudget):
        self.budget = budget
        self.held = 0

    def hold(self, nbytes: int, force: bool = False) -> bool:
        """Hold `nbytes` in all (instead of what is held now); `force`: even past the budget."""
        if self.budget.take(nbytes - self.held):
            self.held = nbytes
            return True
        if force:
            self.budget.used += nbytes - self.held
            self.held = nbytes
        return force

    def release(self) -> None:
        self.budget.take(-self.held)
        self.held = 0

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - (interpreter shutdown)
            pass


class ListingRows(HeldRows):
    """The rows of a store directory's listing, made a window at a time when the kernel asks
    (a directory of 200,000 files would otherwise hold a dozen Python objects per entry for as
    long as it is open: 118 MiB, measured). The listing is held for as long as its directory
    handle is open, whatever its cache does, so it counts in the tree's `RowsBudget`: one
    directory's listings beyond the budget (`RowsBudget.BEYOND`), and a listing that does not
    fit beside the others held is ListingTooLarge (an outside attacker's 12 handles on
    directories of 50,000 long names held 340 MB under `memory=64M`). Handles of one listing
    hold it once (`RowsBudget.share`)."""

    kernel_keeps = LISTING_MAX_AGE

    def __init__(self, listing: Listing, budget: RowsBudget, of: object, where: str):
        super().__init__(budget)
        self.listing = listing
        self.names = listing.names
        self.sharing = False
        self.sharing = budget.share(listing, of)
        if not self.sharing:
            raise ListingTooLarge(
                f"{where}: listing this directory ({len(listing.names)} entries, {listing.nbytes >> 10} KiB) would take more "
                f"than the {budget.max_bytes >> 10} KiB that the listings of open directories may hold ({budget.used >> 10} "
                "KiB held by open directory handles, and larger listings beyond it, another directory's or older ones of "
                "this one); raise -o memory= (or index_cache=)")

    def release(self) -> None:
        if self.sharing:
            self.sharing = False
            self.budget.unshare(self.listing)

    def window(self, start: int, stop: int) -> tuple[list, list, list, list, list, list]:
        li = self.listing
        stop = min(stop, len(li.names))
        is_dir = li.is_dir[start:stop].tolist()
        sizes = [None if size < 0 else size for size in li.sizes[start:stop].tolist()]
        stamps = [li.stamp(i) for i in range(start, stop)]
        tokens = [None if d else li.token(i) for d, i in zip(is_dir, range(start, stop))]
        return (li.names[start:stop], li.inos[start:stop].tolist(), is_dir, sizes, stamps, tokens)  # type: ignore[index]


class _Numbers(InodeRange):
    """A block of inode numbers of a store directory's entries: the first listing's, by
    position, or some reserved for names it gains (`StoreDir.numbered`)."""

    def __init__(self, store_dir: "StoreDir", count: int):
        self.store_dir = store_dir
        self.count = count
        self.start = store_dir.tree.reserve(self)
        self.retired = False

    async def node_at(self, offset: int) -> Node | None:
        listing = await self.store_dir.listing()
        if self.retired:
            raise Stale(f"{self.store_dir.prefix or '/'}: numbered afresh since")
        i = None if listing is None else listing.numbered_at(self.start + offset)
        return None if i is None else self.store_dir.child(listing, i)  # type: ignore[arg-type]


_UNANSWERED = object()


class StoreDir:
    """The entries of one store directory shown as stored. A child's inode number is its
    position in the directory's first sorted listing, in a range of numbers reserved then:
    nothing is kept per entry, and a listing evicted from the cache and read again numbers its
    children the same way. When the directory changes, each name (and kind) keeps its number
    and new names get new ones (`numbered`): renumbering all of it made every number the
    kernel held `Stale`, and two `ls -l` of a directory of 100,000 names that a writer added
    to went from 2-3 s to over 60 s each time it was listed again (an outside attacker; the
    kernel looked up each name again, and each handle's names fought the other's).

    A kept listing is made again when it is used more than `LISTING_MAX_AGE` after it was
    made (files rewritten in place change no directory times), and checked against the
    store's `listing_version` (locally one stat of the directory) at once when a name looked
    up is not in it: a name made in the store opens at its first lookup (close-to-open; the
    kernel keeps no negative entry), and listings show changes, sizes and times within a
    second (`RELIST_SPACING` for costly ones). Before, a local directory's listing stood until
    `zvfs refresh` or its eviction, and its new files were ENOENT for as long (an outside
    attacker, 10 minutes and more). Stores that cannot tell cheaply (remote, archives) keep
    it until `zvfs refresh`."""

    def __init__(self, tree: "Tree", store: Store, prefix: str):
        self.tree = tree
        self.store = store
        self.prefix = prefix
        self._blocks: list[_Numbers] = []  # the first listing's numbers, then new names'
        self._base_digest = b""  # the first listing's digest
        self._handed = 0  # numbers handed out in all
        self._next_new = 0  # the next number for a new name, in the last block
        #: (weak) listings given to directory handles, and when each was last made or found current
        self._given: list[tuple[Callable[[], Listing | None], float]] = []
        self._numbered: Callable[[], Listing | None] = lambda: None  # (weak) the last listing numbered
        self._version: Hashable | None = None  # `listing_version` before the kept listing was made
        self._listed_at = self._took = 0.0  # when the kept listing was made, and how long that took

    def _spacing(self) -> float:
        """Seconds between listings made again by age (`RELIST_SPACING`)."""
        return min(RELIST_SPACING * self._took, RELIST_MAX_SPACING)

    @property
    def follows_store(self) -> bool:
        """Whether kept listings are made again as the store changes (local stores)."""
        return self._version is not None

    async def listing(self, looking_for: str | None = None) -> Listing | None:
        """The directory's listing; `looking_for`: a name looked up, which the listing kept
        is checked for first."""
        key = ("listing", id(self.store), self.prefix)

        async def load() -> Listing | None:
            start = trio.current_time()
            version = await self.store.listing_version(self.prefix)
            entries = await self.store.list(self.prefix)
            self._version = version
            listing = None
            if entries is not None:
                if not self.store.names_are_file_names:
                    entries = _usable(entries, f"{self.store.display}/{self.prefix}")
                listing = self.numbered(Listing.of(entries))
            self._listed_at = trio.current_time()
            self._took = self._listed_at - start
            return listing

        kept, was = self.tree.listings.peek(key)
        if kept and self._version is not None and not isinstance(was, BaseException):
            missed = looking_for is not None and (was is None or was.find(looking_for) is None)
            spacing = self._spacing()  # (a listing that costs more is made again less often)
            aged = not self.tree.listings.checked_within(key, max(LISTING_MAX_AGE, spacing))
            # a costly listing is made again while the kept one answers the names it holds
            # (getattrs and lookups of them waited for it: 2 `ls -l` of 100,000 names on a
            # loaded machine took up to 148 s a round, the listing 16-18 s)
            in_background = aged and not missed and spacing > LISTING_MAX_AGE
            if in_background and self.tree.listings.loading(key):
                return was
            if missed or aged:
                since = trio.current_time()
                version = await self._asked(self.store.listing_version, self.prefix, _UNANSWERED, since)
                if version is _UNANSWERED:
                    pass  # (a hung mount below: what was known stands)
                elif in_background:
                    self.tree.listings.refresh(key, load)
                elif aged:
                    # names, and the sizes and times of files changed in place, which leave
                    # the directory's version as it was (an outside attacker: `stat`, `ls -l`
                    # and `cp -au` showed a file rewritten in place at its old size for good)
                    self.tree.listings.drop(key)
                elif version != self._version and (spacing <= LISTING_MAX_AGE or since - self._listed_at >= spacing) and \
                        await self._asked(self.store.may_hold, self.key(looking_for), False, since):  # type: ignore[arg-type]
                    # (a name that is not there costs no listing: probes for absent names in
                    # a directory being written to, each a listing of all of it, held lookups up)
                    self.tree.listings.drop(key)

        return await self.tree.listings.get(key, load)

    def numbered(self, listing: Listing) -> Listing:
        """`listing` with its entries' inode numbers: those of the first listing by position
        if it has the same names; else each name (and kind) of the last listing numbered
        keeps its number (if that listing is still held: in the cache, or by an open
        directory handle) and new names get new ones; else, or once the numbers handed out
        pass twice the directory's size, numbers of its own (the old ones `Stale`)."""
        n = len(listing.names)
        prior = self._numbered()
        if prior is not None and prior.same_as(listing):
            return prior  # (one object: directory handles holding it share it, `rows`)
        if self._blocks and listing.digest == self._base_digest:
            inos = np.arange(self._blocks[0].start, self._blocks[0].start + n, dtype=np.int64)
        elif self._blocks and prior is not None and prior.inos is not None:
            names, before = np.array(listing.names, dtype=object), np.array(prior.names, dtype=object)
            at = np.minimum(np.searchsorted(before, names), max(0, len(before) - 1))
            kept = (before[at] == names) & (prior.is_dir[at] == listing.is_dir) if len(before) else np.zeros(n, bool)
            inos = np.where(kept, prior.inos[at] if len(before) else 0, -1).astype(np.int64)
            new = np.flatnonzero(~kept)
            if self._handed + len(new) > 2 * n + NEW_NAMES_BLOCK:
                return self._numbered_afresh(listing)
            if len(new):
                last = self._blocks[-1]
                room = last.start + last.count - self._next_new if len(self._blocks) > 1 else 0
                if room < len(new):
                    last = _Numbers(self, max(len(new), NEW_NAMES_BLOCK))
                    self._blocks.append(last)
                    self._next_new = last.start
                inos[new] = np.arange(self._next_new, self._next_new + len(new))
                self._next_new += len(new)
                self._handed += len(new)
        else:
            return self._numbered_afresh(listing)
        listing = listing.numbered(inos)
        self._numbered = weakref.ref(listing)
        return listing

    def _numbered_afresh(self, listing: Listing) -> Listing:
        for block in self._blocks:
            block.retired = True
            self.tree.retire(block)
        self._blocks = [_Numbers(self, len(listing.names))]
        self._base_digest = listing.digest
        self._handed = len(listing.names)
        start = self._blocks[0].start
        listing = listing.numbered(np.arange(start, start + len(listing.names), dtype=np.int64))
        self._numbered = weakref.ref(listing)
        return listing

    async def _asked(self, question: Callable[[str], Awaitable[Any]], about: str, unanswered: Any, since: float) -> Any:
        """`question(about)`, asked once however many ask at once, or `unanswered` if the store
        does not answer within its patience (a hung mount below: what was known stands, and
        until that question is answered the next ones are answered so at once, as the listings
        cache does for its loads). An answer to a question asked before `since` is not taken:
        it is asked again (a lookup that joined a stat made before its file came was ENOENT
        for a file that was there all along: an outside attacker's random writer, 8 in 30,000)."""
        async def ask() -> tuple[float, Any]:
            return trio.current_time(), await question(about)

        for _ in range(2):  # (a second question begins after the first one ended: after `since`)
            try:
                asked, answer = await self.tree.listings.get((question.__name__, id(self.store), about), ask, keep=False)
            except StorageError:
                return unanswered
            if asked >= since:
                break
        return answer

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, listing: Listing, i: int) -> Node:
        entry = listing.entry(i)
        key = self.key(entry.name)
        ino = int(listing.inos[i])  # type: ignore[index]
        if entry.is_dir:
            return PassDir(ino, self.tree.store_dir(self.store, key), entry)
        return PassFile(ino, self.store, key, entry, self)

    async def lookup(self, name: str) -> Node | None:
        listing = await self.listing(looking_for=name)
        i = None if listing is None else listing.find(name)
        return None if i is None else self.child(listing, i)  # type: ignore[arg-type]

    async def entries(self) -> list[tuple[str, Node]]:
        listing = await self.listing()
        return [] if listing is None else [(name, self.child(listing, i)) for i, name in enumerate(listing.names)]

    async def rows(self) -> Rows:
        listing = await self.listing()
        budget, where = self.tree.rows_budget, f"{self.store.display}/{self.prefix}"
        give_up = trio.current_time() + (self.tree.listings.patience or 5.0)
        while listing is not None:
            try:
                rows = ListingRows(listing, budget, self, where)
            except ListingTooLarge:
                # A directory listed again while handles held its last listings did not fit
                # beside them (an outside attacker: most of 2-6 `ls -l` at once of 100,000
                # names under a writer EIO). The newest listing handles hold, if it was current
                # within `SHARED_MAX_AGE` listings' time (names keep their numbers); else the
                # handles that hold the listings in the way (older ones of this directory, or
                # another directory's beyond the budget) are waited for, at most the patience
                # (handles overlapping for good would otherwise show no change, for good), and
                # then the newest one held of this directory all the same: older, not EIO.
                now = trio.current_time()
                held = [(made, li) for ref, made in self._given if (li := ref()) is not None and budget.holds(li)]
                made, newest = max(held, key=lambda h: h[0], default=(0.0, None))
                if newest is not None and (now >= give_up or now - made <= SHARED_MAX_AGE * max(LISTING_MAX_AGE, self._spacing())):
                    return ListingRows(newest, budget, self, where)
                if now >= give_up:
                    raise
                # (not held while waiting: 8 handles of 8 such directories opened at once
                # held 7 listings waiting, the daemon 75-78 MiB up under memory=64M; made
                # again once it would fit)
                need, listing = listing.nbytes, None
                while not budget.fits(need, self) and trio.current_time() < give_up:
                    await trio.sleep(0.05)
                listing = await self.listing()
                continue
            self._given = [(ref, made) for ref, made in self._given if ref() is not None and ref() is not listing]
            self._given.append((weakref.ref(listing), self._listed_at))
            return rows
        return Rows.empty()


def _usable(entries: "list[Entry] | Entries", where: str) -> "list[Entry] | Entries":
    """The entries whose names can be file names (`usable_name`); the others left out with one
    log line (the kernel refuses a whole listing for one name with a '/': a remote index page
    or an archive can hold such names, a local directory cannot)."""
    names = entries.names if isinstance(entries, Entries) else [e.name for e in entries]
    bad = sum(1 for name in names if not usable_name(name))
    if not bad:
        return entries
    log.warning("%s: %d names that cannot be file names (over %d bytes, or with '/' or NUL) not listed", where, bad, MAX_NAME)
    return [e for e in entries if usable_name(e.name)]


class PassDir(Dir):
    """A store "directory" shown as it is."""

    __slots__ = ("dir", "entry")
    kernel_keeps = LISTING_MAX_AGE

    def __init__(self, ino: int, store_dir: StoreDir, entry: Entry | None = None):
        super().__init__(ino)
        self.dir = store_dir
        self.entry = entry

    def stamp(self) -> Stamp:
        return stamp_of(self.entry)

    async def lookup(self, name: str) -> Node | None:
        return await self.dir.lookup(name)

    async def entries(self) -> list[tuple[str, Node]]:
        return await self.dir.entries()

    async def rows(self) -> Rows:
        return await self.dir.rows()


class Tree:
    """Inode table of one mounted view. `listings` holds the store directories' listings
    (the view's index cache: they count against the memory budget)."""

    def __init__(self, listings: CoalescingCache | None = None) -> None:
        self.listings = listings or CoalescingCache(16 << 20, keep_oversized=True)
        #: what the listings held by open directory handles may take (`RowsBudget`)
        self.rows_budget = RowsBudget(max(1 << 20, self.listings.max_bytes))
        self._store_dirs: dict[tuple[int, str], StoreDir] = {}
        self._nodes: dict[int, Node] = {}
        self._keys: dict[Hashable, int] = {}
        self._next = ROOT_INO
        self._range_starts: list[int] = []
        self._ranges: list[InodeRange] = []
        #: computed nodes the kernel just looked up, listed or opened: it asks for them by
        #: number right after (getattr, open), so they are kept here instead of being rebuilt
        self._recent: OrderedDict[int, Node] = OrderedDict()
        #: chunk files of recent listings (views add them), opened by number right after
        self.listed = ListedFiles()
        self.root: Dir | None = None

    def intern(self, key: Hashable, make: Callable[[int], Node]) -> Node:
        ino = self._keys.get(key)
        if ino is not None:
            return self._nodes[ino]
        ino = self._next
        self._next += 1
        node = self._nodes[ino] = make(ino)
        self._keys[key] = ino
        if ino == ROOT_INO:
            assert isinstance(node, Dir)
            self.root = node
        return node

    def reserve(self, block: InodeRange) -> int:
        """Reserve `block.count` numbers for `block`; returns the first."""
        start = self._next
        self._next += max(1, block.count)
        if self._next >= 2**62:  # (the FUSE front's aliases and control files live above)
            raise OverflowError("inode space exhausted")
        self._range_starts.append(start)
        self._ranges.append(block)
        return start

    def store_dir(self, store: Store, prefix: str) -> StoreDir:
        """The one StoreDir of a store directory (a few numbers per directory, none per entry)."""
        found = self._store_dirs.get((id(store), prefix))
        if found is None:
            found = self._store_dirs[(id(store), prefix)] = StoreDir(self, store, prefix)
        return found

    def forget_listings(self) -> None:
        """`zvfs refresh`: every directory lists its store again, computed nodes are rebuilt."""
        self._recent.clear()
        self.listed.clear()
        for node in self._nodes.values():
            forget = getattr(node, "forget", None)
            if forget is not None:
                forget()

    def remember(self, node: Node) -> None:
        """A computed node the kernel will ask for by number soon (the newest one wins)."""
        if node.ino in self._nodes:
            return
        self._recent[node.ino] = node
        self._recent.move_to_end(node.ino)
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)

    def known(self, ino: int) -> Node | None:
        """The node numbered `ino` if it needs no I/O to find: interned, recent or just listed."""
        return self._nodes.get(ino) or self._recent.get(ino) or self.listed.get(ino)

    def retire(self, block: InodeRange) -> None:
        """Forget `block`, a directory's numbers, when it is numbered afresh: its numbers are
        `Stale` from then on (`node`), and nothing is kept of it."""
        i = bisect.bisect_left(self._range_starts, block.start)  # type: ignore[attr-defined]
        if i < len(self._ranges) and self._ranges[i] is block:
            del self._range_starts[i], self._ranges[i]

    async def node(self, ino: int) -> Node | None:
        node = self.known(ino)
        if node is not None:
            return node
        i = bisect.bisect_right(self._range_starts, ino) - 1
        if i < 0 or ino - self._range_starts[i] >= self._ranges[i].count:
            if ROOT_INO < ino < self._next:  # (a number handed out, in no range now: retired)
                raise Stale(f"inode {ino}: of a directory numbered afresh since")
            return None
        return await self._ranges[i].node_at(ino - self._range_starts[i])

    async def resolve(self, path: str) -> Node | None:
        """The node at a `/`-separated path below the root ("" is the root)."""
        node: Node | None = self.root
        for part in (p for p in path.split("/") if p):
            if node is None or not node.is_dir:
                return None
            node = await node.lookup(part)  # type: ignore[union-attr]
        return node


def grid_block_sizes(grid: tuple[int, ...]) -> list[int]:
    """Number of grid prefixes of each length 0..ndim (1, g0, g0*g1, ...)."""
    return [math.prod(grid[:d]) for d in range(len(grid) + 1)]
