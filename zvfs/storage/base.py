"""The key-value interface every store kind implements.

A store is a flat namespace of immutable byte strings addressed by `/`-separated keys
(tensorstore's kvstore idea): formats see only keys and byte ranges, never paths or URLs, so
the same shard logic runs over local disk, HTTP, S3 and GCS.
"""

from __future__ import annotations

import abc
import array
import contextvars
import hashlib
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable

from ..errors import DirectoryTooLarge


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a store "directory" (a key prefix ending at the next `/`)."""

    name: str
    is_dir: bool
    size: int | None  # None when the listing does not say (HTTP index pages)
    mode: int | None = None  # read and search bits a reader has (local: see LocalStore), else None
    mtime_ns: int | None = None  # nanoseconds since the epoch where the listing says, else None
    uid: int | None = None  # owner and group where the store has them (local), else None
    gid: int | None = None
    token: bytes | None = None  # `version_token` of a file where the listing knows its version (local)


@dataclass(frozen=True, slots=True)
class Version:
    """One state of a key's bytes: what a shard index read from it is valid for.

    `tag` identifies the state: locally (st_dev, st_ino, st_mtime_ns, st_ctime_ns) of the file
    that was read, remotely the ETag (or Last-Modified when there is none). Two versions with
    equal `size` and `tag` hold the same bytes; anything else means the key was rewritten,
    replaced or truncated, and byte ranges taken from an index of the old version must not be
    read from the new one (the consistency model in docs/reliability.md)."""

    size: int
    tag: tuple
    mtime_ns: int | None = field(default=None, compare=False)  # nanoseconds since the epoch, None if unknown
    mode: int | None = field(default=None, compare=False)  # read bits a reader has (local files), None if unknown
    uid: int | None = field(default=None, compare=False)
    gid: int | None = field(default=None, compare=False)
    #: False for a local file changed too recently to prove it settled when it was looked at
    #: (LocalStore.SETTLE): a rewrite within the same timestamp tick, or a write still being
    #: copied, would leave this version's tag unchanged. Indexes read from such a version are
    #: not kept, and reads of chunks they locate are checked again (ChunkRef.evidence).
    settled: bool = field(default=True, compare=False)

    def same(self, other: "Version | None") -> bool:
        return other is not None and self.size == other.size and self.tag == other.tag


#: Versions a store remembers (`SeenVersions`): ~200 bytes each.
VERSIONS_KEPT = 65536


class SeenVersions(OrderedDict[str, Version]):
    """key -> the `Version` a store last saw it at, for the VERSIONS_KEPT keys seen most
    recently (the oldest forgotten first): what a remote store answers `current` with, and
    what the disk cache confirmed in this process."""

    def seen(self, key: str, version: Version | None) -> None:
        """An answer showed `key` at `version` (None: missing, forgotten)."""
        if version is None:
            self.pop(key, None)
            return
        self[key] = version
        self.move_to_end(key)
        if len(self) > VERSIONS_KEPT:
            self.popitem(last=False)


#: an unknown mtime in the columns of `Entries` (and `Listing`): mtimes are kept as integer
#: nanoseconds, as the store shows them (a float of seconds since 1970 is ~240 ns coarse, so a
#: file's `st_mtime_ns` through the mount differed from the store's: `make`, `cp -u`, `find
#: -newer` compare nanoseconds)
UNKNOWN_NS = -(1 << 63)


class Entries:
    """A directory's entries as columns: what a local listing gives (200,000 `Entry` objects
    took 63 MiB, and their memory stays fragmented after they go; these columns 19 MiB).
    Iterating gives `Entry` objects, one at a time."""

    __slots__ = ("names", "is_dir", "sizes", "modes", "mtimes_ns", "uids", "gids", "tokens")
    TOKEN = 40  # bytes of a local file's `version_token`; all zero: unknown

    def __init__(self) -> None:
        self.names: list[str] = []
        self.is_dir = array.array("b")
        self.sizes = array.array("q")  # -1: unknown
        self.modes = array.array("q")  # -1: unknown
        self.mtimes_ns = array.array("q")  # UNKNOWN_NS: unknown
        self.uids = array.array("q")  # -1: unknown
        self.gids = array.array("q")
        self.tokens = bytearray()

    def add(self, name: str, is_dir: bool, size: int | None, mode: int | None = None, mtime_ns: int | None = None,
            uid: int | None = None, gid: int | None = None, token: bytes | None = None) -> None:
        self.names.append(name)
        self.is_dir.append(is_dir)
        self.sizes.append(-1 if size is None else size)
        self.modes.append(-1 if mode is None else mode)
        self.mtimes_ns.append(UNKNOWN_NS if mtime_ns is None else mtime_ns)
        self.uids.append(-1 if uid is None else uid)
        self.gids.append(-1 if gid is None else gid)
        self.tokens += token if token is not None and len(token) == self.TOKEN else bytes(self.TOKEN)

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self):
        for i, name in enumerate(self.names):
            size, mode, mtime_ns, uid, gid = self.sizes[i], self.modes[i], self.mtimes_ns[i], self.uids[i], self.gids[i]
            token = bytes(self.tokens[i * self.TOKEN:(i + 1) * self.TOKEN])
            yield Entry(name, bool(self.is_dir[i]), None if size < 0 else size, None if mode < 0 else mode,
                        None if mtime_ns == UNKNOWN_NS else mtime_ns, None if uid < 0 else uid, None if gid < 0 else gid,
                        token if any(token) else None)


#: bytes of the longest name a directory entry can have (NAME_MAX)
MAX_NAME = 255


def usable_name(name: str) -> bool:
    """`name` can be a file name: not empty, `.` or `..`, no `/` or NUL, at most MAX_NAME
    bytes (a store over HTTP, S3 or in an archive can hold keys that cannot)."""
    return (name not in ("", ".", "..") and "/" not in name and "\0" not in name
            and len(name.encode("utf-8", "surrogateescape")) <= MAX_NAME)


#: bytes a local listing takes per entry besides its name (an `Entries` row: 158 for names of
#: 16 characters, tracemalloc): what a local listing under way counts
LISTED_ENTRY = 142
#: bytes a listing counts at once (a directory of fewer than ~1,500 names counts nothing)
LISTING_STEP = 256 << 10

#: what a store's long blocking call (a local listing, at each `LISTING_STEP`) calls as it
#: goes on, in the load that made it (`CoalescingCache`): a load that goes on is waited for,
#: whatever it takes; one that shows nothing for the patience is given up (a hung mount).
#: (A listing of 100,000 names that took more than the 5 s patience on a loaded machine was
#: EIO, and so was every lookup in its directory: an `ls -l` loop and a churn run beside it.)
PROGRESS: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("zvfs_progress", default=None)


class ListingBudget:
    """What a store's listings under way hold together, within `limit` bytes (None: any): so
    neither a directory of a million names nor several of 450,000 listed at once take the
    daemon past its memory budget. Counted from worker threads and other event loops, under
    a lock; each listing counts `LISTING_STEP` bytes at a time and gives back what it counted."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, what: str, taken: int, more: int) -> None:
        """Count `more` bytes of the listing of `what` ("PATH: a directory of more than N
        entries"; `taken` bytes counted already), or refuse it (DirectoryTooLarge) if that
        would pass the limit."""
        with self._lock:
            others = self.held - taken
            if self.limit is not None and self.held + more > self.limit:
                besides = f", {others >> 20} MiB of it held by other listings under way" if others >= 1 << 20 else ""
                raise DirectoryTooLarge(f"{what}: its listing would take more than the {self.limit >> 20} MiB of "
                                        f"-o memory={besides} (raise it to list it)")
            self.held += more

    def give_back(self, taken: int) -> None:
        with self._lock:
            self.held -= taken


#: bytes a `CountedListing` holds per entry besides its name's characters (tracemalloc, 100,000
#: names: 193 for names of 10 characters: the `Entry`, the name's str, its dict slot, the list
#: it is returned in)
COUNTED_ENTRY = 184


class CountedListing:
    """The entries of one listing under way, counted in a store's listing budget as they come
    (`COUNTED_ENTRY` an entry plus its name) and given back when it ends:
    a listing past the budget is DirectoryTooLarge (EIO, one line naming the option) before it
    is all read. Remote listings and an OCDBT database's; one per attempt (a retried listing
    starts again). A name found twice is listed once."""

    def __init__(self, budget: ListingBudget, path: str):
        self.budget = budget
        self.path = path.rstrip("/")
        self.found: dict[str, Entry] = {}
        self.taken = self.owed = 0

    def __enter__(self) -> CountedListing:
        return self

    def __exit__(self, *exc) -> None:
        self.budget.give_back(self.taken)

    def count(self, more: int, what: str | None = None) -> None:
        """Count `more` bytes of this listing; `what` the directory is if that is refused
        (default: "of more than N entries")."""
        self.owed += more
        if self.owed >= LISTING_STEP:
            what = what or f"of more than {len(self.found):,} entries"
            self.budget.take(f"{self.path}: a directory {what}", self.taken, self.owed)
            self.taken, self.owed = self.taken + self.owed, 0

    def add(self, name: str, is_dir: bool, size: int | None) -> None:
        if name not in self.found:
            self.found[name] = Entry(name, is_dir, size)
            self.count(COUNTED_ENTRY + len(name))

    def entries(self) -> list[Entry]:
        return list(self.found.values())


def layer_attribute(store: Store, name: str):
    """Attribute `name` of `store` or of the first store below it (`inner`, as read-ahead, disk
    caches, archives and databases wrap stores) that has one not None; None if none has."""
    layer: Store | None = store
    while layer is not None:
        found = getattr(layer, name, None)
        if found is not None:
            return found
        layer = getattr(layer, "inner", None)
    return None


def listing_budget_of(store: Store) -> ListingBudget:
    """The listing budget of `store` or of the first store below it that has one (a store over
    another counts its listings with the one below: an OCDBT database's with its directory's)."""
    return layer_attribute(store, "listing_budget") or ListingBudget(None)


def version_token(v: Version) -> Hashable:
    """A compact value that is equal for equal versions (size and tag): 40 packed bytes for a
    local file's (a listing of 200,000 files keeps one per entry: a tuple of five ints cost
    ~200 bytes each, these 73), else the pair."""
    tag = v.tag
    if len(tag) == 4 and all(type(t) is int for t in tag):
        return _PACK(v.size, *tag)
    return (v.size, tag)


_PACK = struct.Struct("<5q").pack


#: `Store.patience` of stores that do not bound their own calls (local files: a read on a hung
#: NFS or FUSE mount never returns). A shard index read from local disk takes milliseconds;
#: a lookup that waits this long is EIO, so the directory it holds in the kernel is free again.
STALL_PATIENCE = 5.0


class Store(abc.ABC):
    """Async reads of byte ranges of keys. Every method is safe to call from trio tasks."""

    #: What the user named (path or URL with credentials removed); used in messages.
    display: str
    #: Seconds a request of the FUSE daemon waits for what it needs of this store (a shard
    #: index, a listing) before it gives up with EIO (storage/cache.py): a remote store's own
    #: bound, retry_deadline + request_timeout; `STALL_PATIENCE` for the others.
    patience: float = STALL_PATIENCE

    @abc.abstractmethod
    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        """Bytes `[start, start+length)` of `key` (to the end when `length` is None).

        A negative `start` asks for the last `-start` bytes (one suffix request on HTTP).
        Returns None when the key does not exist; a range past the end comes back short,
        and callers that know the length they expect must check it. `extent` is a hint: the
        caller will soon want the bytes up to that offset too (remote stores fetch them now).

        With `expect`, the bytes must come from that version of the key: if the key now holds
        other bytes (rewritten, replaced, truncated, deleted), raise `ShardChanged` instead of
        returning them. Locally an open descriptor of the expected file still counts (an atomic
        replace leaves the old file readable through it).
        """

    def read_now(self, key: str, start: int, length: int, expect: Version | None = None) -> "bytes | memoryview | None":
        """What `read` would return for this exact range, if it is at hand without waiting
        (locally: an open shard whose pages are cached), else None; raises like `read`. The
        result may be a view of a buffer that the store's next read overwrites: only for
        callers that are done with it before they next await (the FUSE reply, which pyfuse3
        copies out at once: no copy of the chunk in Python)."""
        return None

    async def pin(self, key: str, known: Version | None = None) -> "Pin | None":
        """The key as it is now, held for reading: an open file's snapshot (None when the key
        does not exist). `known`: a version this request has just read the key at. Remote
        stores ask nothing: the version is the one the last response showed (or `known`), and
        every read sends it along (If-Match) or checks it."""
        return Pin(key, known if known is not None else await self.current(key), self)

    def pin_now(self, key: str) -> "Pin | None":
        """`pin`, when it can be done without waiting (locally: a cached descriptor that the
        path still names, looked up from the kernel's caches); else None (then `pin`)."""
        return None

    async def info(self, key: str) -> Entry | None:
        """One name as a listing would give it (its owner and bits, for the views' directories),
        where the store can tell without a listing; None otherwise."""
        return None

    #: whether its directories have owners and bits (`known_dir`): local stores
    dir_bits: bool = False
    #: whether every name it lists can be a file name (`usable_name`): local stores
    names_are_file_names: bool = False
    #: moves whenever what `known_dir` knows changes (a directory learned, changed or forgotten)
    generation: int = 0

    def known_dir(self, key: str) -> tuple[int, int, int] | None:
        """(owner, group, read and search bits a reader of the store has: the directory's own,
        less the classes a directory above stops) of store directory `key`, if known without
        I/O; None otherwise, and always for stores whose directories have no bits (remote)."""
        return None

    async def learn_dir(self, key: str) -> tuple[int, int, int] | None:
        """`known_dir`, looked up when not known (None: not a directory there, or no bits)."""
        return None

    def root_mode(self) -> tuple[int | None, int | None, int | None] | None:
        """(mode, uid, gid) the store's root shows: the read and search bits a reader has, its
        owner and group, where the store has them (local files, archives in them, stores over
        them; None in a place: unknown); None for stores that have none (remote)."""
        return None

    @abc.abstractmethod
    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        """Like `read` (exact range, no read-ahead), plus the version the bytes were read from
        (None with the bytes when the key does not exist). Shard indexes are read with this, so
        that every byte range taken from an index is tied to the version it describes."""

    @abc.abstractmethod
    async def current(self, key: str) -> Version | None:
        """The key's version as cheaply known now: locally a fresh `stat` of the path (a
        replaced file shows its new identity); remotely the version the last response for
        this key carried (no request), or None when nothing was read yet. Called when a chunk
        file is opened, to notice a changed shard before reading it."""

    @abc.abstractmethod
    async def size(self, key: str) -> int | None:
        """Length of `key` in bytes, or None if it does not exist."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> "list[Entry] | Entries | None":
        """Entries directly below `prefix` ("" is the root), or None if it is not a directory."""

    async def listing_version(self, prefix: str) -> Hashable | None:
        """What a listing of `prefix` made now would be made from, as cheaply known (equal
        versions: equal listings), or None where nothing cheap tells (remote stores, archives:
        a kept listing stands until `zvfs refresh`)."""
        return None

    async def may_hold(self, key: str) -> bool:
        """Whether `key` may be there now, as cheaply known (locally one lstat): a name looked
        up that its directory's kept listing lacks is listed again only if it may."""
        return True

    async def aclose(self) -> None:
        """Release descriptors and clients."""


class Pin:
    """One version of one key held for reading (an open file's snapshot): every byte read
    through it comes from that version, or the read raises `ShardChanged`. A pin whose version
    is not known yet (a remote key never read) takes the version its first read shows."""

    __slots__ = ("key", "version", "_store")

    def __init__(self, key: str, version: Version | None, store: Store | None = None):
        self.key = key
        self.version = version
        self._store = store

    async def read(self, start: int, length: int, extent: int | None = None) -> bytes | None:
        if self.version is None:
            data, self.version = await self._store.read_version(self.key, start, length)  # type: ignore[union-attr]
            return data
        return await self._store.read(self.key, start, length, extent, expect=self.version)  # type: ignore[union-attr]

    def read_now(self, start: int, length: int) -> bytes | memoryview | None:
        """`read`, if the bytes are at hand without waiting (see `Store.read_now`), else None."""
        return None

    async def verify(self, evidence: tuple) -> Version | None:
        """After a read located by `evidence` (`ChunkRef.evidence`, for unsettled versions):
        the version if the key still holds those bytes (settled, if it is now), else None."""
        return self.version

    def release(self) -> None:
        """The open file is closed."""


def proof(offset: int, data: bytes) -> tuple[int, int, bytes]:
    """What `Pin.verify` compares for `data` read at `offset`: the bytes themselves when short
    (index entries), else their 16-byte BLAKE2b digest (a minishard index)."""
    return offset, len(data), bytes(data) if len(data) <= 64 else hashlib.blake2b(data, digest_size=16).digest()
