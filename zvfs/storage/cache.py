"""A bounded, coalescing async cache for decoded shard indexes and similar derived data.

Bounded by the sum of the entries' sizes (LRU eviction), so memory stays flat however many
shards a reader walks. Concurrent requests for a key that is being loaded wait for that one
load instead of issuing their own (single flight): a directory listing that fans out over
many chunks of one shard costs one index read.

Loaders may fail. `CorruptShardError` is a property of immutable bytes and is cached like a
value (so a bad shard is reported once, not on every read); other errors are not cached, but a
listing refused for the memory budget (`DirectoryTooLarge`) is answered so, at once, for as
long as it took to find out (at most the patience): the kernel asks for one directory one
request at a time, so each `ls` waiting behind a refused one made it again (an outside
attacker's 16 `ls` at once of a directory whose index page never ends ended 4-5 s apart,
the last after 67 s, past the 50 s patience).
Neither is anything read from a version that is not settled (`Version.settled`: a local file
changed too recently to prove that its tag will change with its next write): it serves the
requests waiting for that load and is read again by the next one.

With a `patience` (the FUSE daemon sets the store's: `Store.patience`), no request waits for a
load longer than that, whatever the store does (a read on a hung filesystem never returns).
The kernel serves the lookups of one directory one at a time (libfuse before 3.17 never asks
for FUSE_PARALLEL_DIROPS: fronts/fuse_daemon.py), and a lookup needs its shard's index: a
lookup of a chunk of a shard on a hung mount froze its whole directory, for good (the readers
behind it in D state, even after SIGKILL). With a patience:

* loads run in tasks of their own (system tasks), which no request's giving up cancels: what
  a load brings back is kept for the next request even when nobody waits for it any more;
* a request waits at most `patience` (+ `SLACK`) for a load that shows nothing (a load that
  shows it goes on, `PROGRESS`, as a local listing of a huge directory on a busy machine
  does, is waited for), then fails (StorageError: EIO) and leaves the load running; until
  that load ends, requests for its key fail at once (it is *overdue*): a shard on a hung
  mount costs its directory `patience` once, and its own files EIO, not a frozen directory.
  (A remote store also keeps the calls made while it is stalled within the stall's deadline:
  storage/remote.py.)
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Hashable

import trio

from ..errors import CorruptShardError, DirectoryTooLarge, ShardChanged, StorageError
from .base import PROGRESS, Store

log = logging.getLogger("zvfs.cache")

#: how old a shard's version check may be when a listing uses its cached index (opens always
#: check). `find` over the 65 directories of a 4096-file array in 64 shards stat'ed them 576
#: times (each directory spans a row of 8 shards), 3 syscalls each, instead of 64 times;
#: mountpoint-s3's default metadata TTL is 1 s as well
LISTING_MAX_AGE = 1.0
#: seconds over the patience that a request waits for a load (the store's own deadline, whose
#: message says more, ends the load first)
SLACK = 0.25


class _GoingOn:
    """When a load last showed it goes on (`PROGRESS`; called from worker threads too). Apart
    from its flight: what copies the load's context (a worker thread, a connection's tasks)
    keeps this alive, and a flight kept so kept its value: 16 endless index pages listed at
    once took the daemon to 413 MiB against 198."""

    __slots__ = ("at",)

    def __init__(self):
        self.at = time.monotonic()

    def __call__(self) -> None:
        self.at = time.monotonic()


class _Flight:
    __slots__ = ("done", "value", "error", "overdue", "waiters", "going_on")

    def __init__(self):
        self.done = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.overdue = False  # a request gave up waiting for it
        self.waiters = 0
        self.going_on = _GoingOn()


def nbytes_of(value: Any) -> int:
    """Size of a cached value that knows its `nbytes` (indexes, chunk tables); None is free."""
    return 0 if value is None else value.nbytes


def decoded_size(value: Any) -> int:
    """Size of decoded data: bytes, or objects that know their `nbytes`."""
    if value is None:
        return 0
    return len(value) if isinstance(value, (bytes, bytearray)) else value.nbytes


#: bytes an entry costs besides its value (the OrderedDict slot, key and tuple)
ENTRY_COST = 64
#: refused listings remembered at most (module docstring); past it, the expired are forgotten
REFUSALS_KEPT = 1024


class CoalescingCache:
    """`keep_oversized`: a value larger than the whole cache is still kept (for listings:
    re-listing a huge directory on every lookup would be far worse than exceeding the budget
    by one listing), beside the others, which it does not count against: only another such
    value or a drop ends it. (It used to be kept alone, so the next small listing evicted it:
    the kernel looking up `plain` and `big` again made an outside attacker's `ls -l` of
    `plain/big`, 100,000 names under memory=64M, list all of it again and again, for good.)"""

    def __init__(self, max_bytes: int, sizeof: Callable[[Any], int] = nbytes_of, keep_oversized: bool = False,
                 patience: float | None = None, name: str = ""):
        self.max_bytes = max_bytes
        self.keep_oversized = keep_oversized
        self._sizeof = sizeof
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0  # (the oversized value's left out)
        self._oversized: tuple[Hashable, int] | None = None  # (key, size) of the value larger than the cache
        self._flights: dict[Hashable, _Flight] = {}
        self._checked: dict[Hashable, float] = {}  # key -> when its source's version last matched
        self._refused: dict[Hashable, tuple[float, str]] = {}  # key -> (until, message): DirectoryTooLarge
        self.hits = 0
        self.misses = 0
        #: seconds a request waits for a load at most (None: as long as it takes; module
        #: docstring), and the store's name for messages
        self.patience = patience
        self.name = name

    @property
    def nbytes(self) -> int:
        return self._bytes + (self._oversized[1] if self._oversized is not None else 0)

    async def get(self, key: Hashable, load: Callable[[], Awaitable[Any]], keep: bool = True) -> Any:
        """The value of `key`, loaded once however many ask at once; `keep` False: only that
        (a question to the store within the patience, such as whether a directory changed)."""
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return _unwrap(hit[0])
        flight = self._flights.get(key)
        refused = self._refused.get(key) if flight is None else None
        if refused is not None:
            if trio.current_time() < refused[0]:
                raise DirectoryTooLarge(refused[1])
            del self._refused[key]
        if flight is None:
            self.misses += keep
            if self.patience is None:
                flight = self._flights[key] = _Flight()
                await self._load(key, load, flight, keep)
            else:
                flight = self._start(key, load, keep)
        elif flight.overdue:
            raise StorageError(f"{self._where(key)}: no answer yet (still waiting for an earlier request)")
        if not flight.done.is_set():
            flight.waiters += 1
            try:
                wait = math.inf if self.patience is None else self.patience + SLACK
                while True:
                    with trio.move_on_after(wait):
                        await flight.done.wait()
                    quiet = time.monotonic() - flight.going_on.at  # (a load that goes on is waited for: `PROGRESS`)
                    if flight.done.is_set() or quiet >= self.patience:  # type: ignore[operator]
                        break
                    wait = self.patience + SLACK - quiet  # type: ignore[operator]
            finally:
                flight.waiters -= 1
            if not flight.done.is_set():
                flight.overdue = True
                raise StorageError(f"{self._where(key)}: no answer within {self.patience:g} s")
        if flight.error is not None:
            raise flight.error
        return _unwrap(flight.value)

    async def _load(self, key: Hashable, load: Callable[[], Awaitable[Any]], flight: _Flight, keep: bool = True) -> None:
        """One load, for the request that found no flight (without a patience: in its task) or
        in a system task of its own (it outlives the requests that wait for it, and ends with
        the daemon); what it brings back is in `flight` when `flight.done` is set."""
        start = trio.current_time()
        going_on = PROGRESS.set(flight.going_on)
        try:
            try:
                value = await load()
            except CorruptShardError as e:
                value = _Failed(e)
            flight.value = value
            if keep:
                self._put(key, value)
        except DirectoryTooLarge as e:
            flight.error = e
            self._refuse(key, str(e), trio.current_time() - start)
        except trio.Cancelled:
            flight.error = StorageError(f"{self._where(key)}: its read was cancelled")
            raise
        except Exception as e:  # delivered to the requests waiting (a system task must not raise)
            flight.error = e
            if flight.overdue and flight.waiters == 0 and not isinstance(e, (StorageError, ShardChanged, OSError)):
                log.error("loading %s failed", self._where(key), exc_info=e)
        finally:
            PROGRESS.reset(going_on)
            del self._flights[key]
            flight.done.set()

    def _refuse(self, key: Hashable, message: str, took: float) -> None:
        if len(self._refused) >= REFUSALS_KEPT:
            now = trio.current_time()
            self._refused = {k: v for k, v in self._refused.items() if v[0] > now}
            if len(self._refused) >= REFUSALS_KEPT:
                self._refused.clear()
        self._refused[key] = (trio.current_time() + min(took, math.inf if self.patience is None else self.patience), message)

    def _where(self, key: Hashable) -> str:
        """The store key a cache key is about (its longest string, past a leading tag such as
        "listing": the fifth outside attacker's EIO named `<store>/listing`, no directory), for
        messages."""
        words = [key] if isinstance(key, str) else [k for k in key if isinstance(k, str)] if isinstance(key, tuple) else []
        if len(words) > 1 and key[0] is words[0]:  # type: ignore[index]
            words = words[1:]
        what = max(words, key=len) if words else repr(key)[:80]
        return f"{self.name}/{what}" if self.name else what

    def loading(self, key: Hashable) -> bool:
        """Whether a load of `key` is under way."""
        return key in self._flights

    def refresh(self, key: Hashable, load: Callable[[], Awaitable[Any]]) -> None:
        """Load `key` again in a task of its own, what is cached answering meanwhile (until
        the new value replaces it); nothing if a load of it is under way."""
        if key not in self._flights:
            self.misses += 1
            self._start(key, load)

    def _start(self, key: Hashable, load: Callable[[], Awaitable[Any]], keep: bool = True) -> _Flight:
        """A load of `key` begun in a system task of its own (module docstring)."""
        flight = self._flights[key] = _Flight()
        trio.lowlevel.spawn_system_task(self._load, key, load, flight, keep, name=f"zvfs load {self._where(key)}",
                                        context=contextvars.copy_context())
        return flight

    def checked_within(self, key: Hashable, seconds: float) -> bool:
        """Whether `key` was loaded or found unchanged less than `seconds` ago."""
        when = self._checked.get(key)
        return when is not None and time.monotonic() - when < seconds

    def mark_checked(self, key: Hashable) -> None:
        if key in self._entries:
            self._checked[key] = time.monotonic()

    def peek(self, key: Hashable) -> tuple[bool, Any]:
        """(True, value) if `key` is cached, without loading or counting; a cached failure
        comes back as its exception object."""
        hit = self._entries.get(key)
        if hit is None:
            return False, None
        value = hit[0]
        return True, value.error if isinstance(value, _Failed) else value

    def hit(self, key: Hashable, missing: Any = None) -> Any:
        """The cached value of `key` (counted as a hit), or `missing` if it is not cached."""
        found = self._entries.get(key)
        if found is None:
            return missing
        self._entries.move_to_end(key)
        self.hits += 1
        return _unwrap(found[0])

    def drop(self, key: Hashable) -> None:
        """Forget one entry (its source changed)."""
        hit = self._entries.pop(key, None)
        self._checked.pop(key, None)
        self._refused.pop(key, None)
        if self._oversized is not None and self._oversized[0] == key:
            self._oversized = None
        elif hit is not None:
            self._bytes -= hit[1]

    def clear(self) -> None:
        """Forget everything (`zvfs refresh`); loads in flight finish and are kept."""
        self._entries.clear()
        self._checked.clear()
        self._refused.clear()
        self._bytes = 0
        self._oversized = None

    def _put(self, key: Hashable, value: Any) -> None:
        size = ENTRY_COST if isinstance(value, _Failed) else self._sizeof(value) + ENTRY_COST
        if size > self.max_bytes and not self.keep_oversized or not _settled(value):
            return
        self.drop(key)
        if size > self.max_bytes:  # (kept beside the others: the class docstring)
            if self._oversized is not None:
                self.drop(self._oversized[0])
            self._oversized = (key, size)
        else:
            self._bytes += size
        self._entries[key] = (value, size)
        self._checked[key] = time.monotonic()  # what was just loaded matches its source
        while self._bytes > self.max_bytes:
            gone = next(k for k in self._entries if self._oversized is None or k != self._oversized[0])
            self._bytes -= self._entries.pop(gone)[1]
            self._checked.pop(gone, None)


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: CorruptShardError):
        self.error = error


def _settled(value: Any) -> bool:
    """Whether a value (or a failure) was read from a settled version, or from no version."""
    version = getattr(value.error if isinstance(value, _Failed) else value, "version", None)
    return version is None or version.settled


def _unwrap(value: Any) -> Any:
    if isinstance(value, _Failed):
        raise value.error
    return value


async def drop_if_changed(cache: CoalescingCache, key: Hashable, store: Store, name: str, max_age: float = 0.0) -> bool:
    """Drop the cached index `key` of store key `name` if the object changed since the index
    was read: its current version differs from the one the index (or the failure, or the
    absence) was recorded with. Locally this costs one stat; remotely nothing (the store
    compares with what its responses said). An entry loaded or found unchanged less than
    `max_age` seconds ago is taken as it is (listings: `LISTING_MAX_AGE`). True when the
    cached entry is still good."""
    found, cached = cache.peek(key)
    if not found:
        return False
    if max_age and cache.checked_within(key, max_age):
        return True
    now = await store.current(name)
    then = getattr(cached, "version", None)
    if cached is None:  # recorded as absent
        stale = now is not None
    else:  # an index (or failure) without a version cannot be compared: kept
        stale = then is not None and not then.same(now)
    if stale:
        log.info("%s changed since its index was read: reading it again", name)
        cache.drop(key)
    else:
        cache.mark_checked(key)
    return not stale
