"""Read-ahead for remote stores that follows the access pattern, over a versioned block cache.

`cp -r` and `find | xargs cat` walk the chunk files of one shard after another; over HTTP or S3
one request per chunk costs a round trip each. Random access (an ML loader, a viewer) reads
one chunk here and one there; fetching a window around each wastes bytes (issue 11: a second,
non-neighbouring chunk per shard fetched a 1 MiB window each, 29x the chunk bytes). So, as the
kernel's readahead and mountpoint-s3's prefetcher do, each shard keeps a few *streams*:

* a read that no stream explains is random: it fetches exactly what it needs (up to `extent`,
  the end of the chunk file, so a chunk the kernel reads in 128 KiB pieces is one request) and
  starts a stream there;
* a read that continues a stream (it starts inside the stream's span or at most one window
  past its end, two once the stream has been continued) fetches a window from the stream's end that doubles each time: 4x the first
  read, then 8x, ... up to `window` bytes (the `readahead` option).

Jumps forward count because zarr-python writes the chunks of a shard in Morton order while
`cp -r` walks them in C order: row 0 of an 8x8-chunk shard is chunks 0, 2, 8, 10, 32, ... of
the shard's bytes, so a walk reaches the bytes in growing forward jumps and comes back for the
holes; fetching from the stream's end fills them on the way. Measured with a simulated store
(64 KiB chunks, 4 MiB shards walked in C order): one window per read that exactly continues
the previous one took 8 requests per shard, continuing within one window 10 (holes fetched
again), within two windows and filling the holes 6, at 1.02x the bytes. A fresh stream
reaches one window only: dense random reads (1024 of the 512 32 KiB chunks of each of 8
shards) fetched 1.51x the chunk bytes with two windows, 1.25x with one, and the walks above
kept their request counts. Over nginx:
tests/test_remote.py (cp -r) and tests/test_readahead_pattern.py (sparse and parallel reads).

A window stops where bytes already cached or being fetched begin, so concurrent walkers of one
shard do not fetch the same window twice; readers that want bytes being fetched wait for that
fetch. (A chunk that straddles the end of a cached window is fetched whole: 1.008x the bytes
for `find | xargs cat` in tests/test_readahead_pattern.py.)
Every cached block remembers the version of the key it came from: a block of another version
never serves a read that expects a version, and a fetch that shows a new version drops the
key's old blocks. Every fetch is counted (`requests`, `bytes`) for `zvfs stats` and benches.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

import trio

from ..errors import ShardChanged
from .base import Entry, Store, Version

#: Streams remembered per key (concurrent walkers of one shard) and keys with streams.
STREAMS_PER_KEY = 8
KEYS_WITH_STREAMS = 4096


class _Block:
    __slots__ = ("data", "start", "version")

    def __init__(self, start: int, data: bytes, version: Version | None):
        self.start = start
        self.data = data
        self.version = version

    @property
    def end(self) -> int:
        return self.start + len(self.data)


class _Stream:
    """A run of reads of one key: its span [begin, end) and the window its next fetch gets."""

    __slots__ = ("begin", "end", "window", "walked")

    def __init__(self, begin: int, end: int, window: int):
        self.begin = begin
        self.end = end
        self.window = window
        self.walked = False  # continued at least once

    def continued_by(self, start: int) -> bool:
        return self.begin <= start <= self.end + (2 if self.walked else 1) * self.window


class CoalescingStore(Store):
    def __init__(self, inner: Store, window: int = 1 << 20, cache_bytes: int = 64 << 20):
        self.inner = inner
        self.display = inner.display
        self.window = window
        self.cache_bytes = cache_bytes
        self._blocks: dict[str, list[_Block]] = {}  # per key, sorted by start, non-overlapping
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (key, start) -> size
        self._cached = 0
        self._streams: OrderedDict[str, list[_Stream]] = OrderedDict()
        self._inflight: dict[str, list[tuple[int, int, trio.Event]]] = {}
        #: a disk cache below (diskcache.py), asked for exactly the bytes a read wants before
        #: a window is fetched: windows differ from mount to mount (measured: 41 of 353 reads of
        #: a warm cache missed without this)
        self._disk = getattr(inner, "cached", None) and inner
        self.requests = 0
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def patience(self) -> float:  # type: ignore[override]
        return self.inner.patience

    def cache_stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "bytes": self._cached, "blocks": len(self._lru)}

    # -- the block cache

    def _lookup(self, key: str, start: int, end: int, expect: Version | None) -> bytes | None:
        blocks = self._blocks.get(key)
        if not blocks:
            return None
        i = bisect.bisect_right([b.start for b in blocks], start) - 1
        if i < 0 or blocks[i].end < end:
            return None
        b = blocks[i]
        if expect is not None and not expect.same(b.version):
            return None
        self._lru.move_to_end((key, b.start))
        return b.data[start - b.start : end - b.start]

    def _next_held(self, key: str, start: int) -> int | None:
        """Where the first byte after `start` that is cached or being fetched begins: a new
        window stops there, so concurrent walkers of one shard never fetch a byte twice."""
        starts = [b.start for b in self._blocks.get(key, ()) if b.start > start]
        starts += [s for s, _, _ in self._inflight.get(key, ()) if s > start]
        return min(starts, default=None)

    def _held(self, key: str, start: int, end: int) -> bool:
        """Whether any byte of [start, end) is cached or being fetched."""
        return any(b.start < end and b.end > start for b in self._blocks.get(key, ())) or \
            any(s < end and e > start for s, e, _ in self._inflight.get(key, ()))

    def _store(self, key: str, start: int, data: bytes, version: Version | None) -> None:
        if not data or len(data) > self.cache_bytes:
            return
        # keep blocks disjoint: drop any cached block the new one overlaps
        end = start + len(data)
        for old in [b for b in self._blocks.get(key, ()) if b.start < end and b.end > start]:
            self._drop(key, old)
        blocks = self._blocks.setdefault(key, [])  # (dropping may have removed the key's list)
        blocks.insert(bisect.bisect_left([b.start for b in blocks], start), _Block(start, data, version))
        self._lru[(key, start)] = len(data)
        self._cached += len(data)
        while self._cached > self.cache_bytes:
            (k, s), _ = next(iter(self._lru.items()))
            self._drop(k, next(b for b in self._blocks[k] if b.start == s))

    def _drop(self, key: str, block: _Block) -> None:
        self._blocks[key].remove(block)
        if not self._blocks[key]:
            del self._blocks[key]
        self._cached -= self._lru.pop((key, block.start))

    def _seen(self, key: str, version: Version | None) -> None:
        """A fetch showed `key` at `version`: blocks of any other version are stale."""
        for b in [b for b in self._blocks.get(key, ()) if b.version != version and not (version and version.same(b.version))]:
            self._drop(key, b)

    # -- access pattern

    def _stream(self, key: str, start: int, need: int) -> tuple[_Stream, bool]:
        """The stream a miss at `start` continues (grown), or a new one; and whether it continued."""
        streams = self._streams.get(key)
        if streams is None:
            streams = self._streams[key] = []
            if len(self._streams) > KEYS_WITH_STREAMS:
                self._streams.popitem(last=False)
        self._streams.move_to_end(key)
        for s in streams:
            if s.continued_by(start):
                streams.remove(s)
                streams.append(s)
                return s, True
        s = _Stream(start, need, min(self.window, 4 * (need - start)))
        streams.append(s)
        del streams[:-STREAMS_PER_KEY]
        return s, False

    # -- Store

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        if length == 0:
            return b""
        if start < 0 or length is None:  # suffix (index) and whole-key reads: exact
            return await self._fetch(key, start, length, expect)
        end = start + length
        while True:
            hit = self._lookup(key, start, end, expect)
            if hit is not None:
                self.hits += 1
                return hit
            waiting = next((ev for s, e, ev in self._inflight.get(key, []) if s <= start and end <= e), None)
            if waiting is None:
                break
            await waiting.wait()
        need = max(end, extent or end)
        if self._disk is not None:  # a disk cache below: the bytes wanted, whatever window once fetched them
            found = await self._disk.cached(key, start, need, expect)
            if found is not None:  # (counted as the disk cache's hit)
                return found[: end - start]
        self.misses += 1
        stream, continued = self._stream(key, start, need)
        first, want = start, need
        if continued:
            # a forward jump also fetches the bytes it skipped (unless held): the walk comes back
            if start > stream.end and not self._held(key, stream.end, start):
                first = stream.end
            want = max(need, first + stream.window)
            stream.window = min(self.window, 2 * stream.window)
            stream.walked = True
        stop = self._next_held(key, first)
        if stop is not None and stop >= end:
            want = min(want, stop)
        done = trio.Event()
        flight = (first, want, done)
        self._inflight.setdefault(key, []).append(flight)
        try:
            data = await self._fetch(key, first, want - first, expect)
        finally:
            self._inflight[key].remove(flight)
            if not self._inflight[key]:
                del self._inflight[key]
            done.set()
        if data is None:
            return None
        stream.end = max(stream.end, first + len(data))
        return data[start - first : end - first]

    async def _fetch(self, key: str, start: int, length: int | None, expect: Version | None) -> bytes | None:
        """One request to the store below; its bytes are cached under the version they are of."""
        data, version = await self.read_version(key, start, length)
        if expect is not None:
            if data is None:
                raise ShardChanged(key, "deleted while mounted")
            if not expect.same(version):
                if data:
                    self._store(key, start, data, version)  # valid for the new version
                raise ShardChanged(key)
        if data and start >= 0:
            self._store(key, start, data, version)
        return data

    async def read_version(self, key: str, start: int = 0, length: int | None = None) -> tuple[bytes | None, Version | None]:
        self.requests += 1
        data, version = await self.inner.read_version(key, start, length)
        self.bytes += len(data or b"")
        self._seen(key, version)
        return data, version

    async def current(self, key: str) -> Version | None:
        return await self.inner.current(key)

    async def size(self, key: str) -> int | None:
        return await self.inner.size(key)

    async def list(self, prefix: str) -> list[Entry] | None:
        return await self.inner.list(prefix)

    async def aclose(self) -> None:
        await self.inner.aclose()
