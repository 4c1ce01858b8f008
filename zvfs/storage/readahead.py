"""Read coalescing for remote stores: neighbouring chunks of a shard in one range request.

`cp -r` and `find | xargs cat` walk the chunk files of one shard after another. Over HTTP or
S3 one request per chunk costs a round trip each; this layer notices that a key (shard) is
being walked (its second data read) and from then on fetches a window of `window` bytes from
the requested offset, stopping at bytes it already holds, and serves later reads from a
bounded block cache. The first read of a key is exact, so random single-chunk access
transfers no more than it needs. A caller may pass `extent` (how far the bytes it is reading
go, e.g. the end of the chunk file) so that a large chunk read by the kernel in 128 KiB pieces
is fetched once.

Concurrent readers of one shard share in-flight fetches instead of repeating them. Every
fetch is counted (`requests`, `bytes`) for the benchmarks and the log.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

import trio

from .base import Entry, Store


class _Block:
    __slots__ = ("start", "data")

    def __init__(self, start: int, data: bytes):
        self.start = start
        self.data = data

    @property
    def end(self) -> int:
        return self.start + len(self.data)


class CoalescingStore(Store):
    def __init__(self, inner: Store, window: int = 1 << 20, cache_bytes: int = 64 << 20):
        self.inner = inner
        self.display = inner.display
        self.window = window
        self.cache_bytes = cache_bytes
        self._blocks: dict[str, list[_Block]] = {}  # per key, sorted by start, non-overlapping
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (key, start) -> size
        self._cached = 0
        self._reads: dict[str, int] = {}  # data reads seen per key (walk detection)
        self._inflight: dict[str, list[tuple[int, int, trio.Event]]] = {}
        self.requests = 0
        self.bytes = 0

    # -- the block cache

    def _lookup(self, key: str, start: int, end: int) -> bytes | None:
        blocks = self._blocks.get(key)
        if not blocks:
            return None
        i = bisect.bisect_right([b.start for b in blocks], start) - 1
        if i < 0 or blocks[i].end < end:
            return None
        b = blocks[i]
        self._lru.move_to_end((key, b.start))
        return b.data[start - b.start : end - b.start]

    def _next_held(self, key: str, start: int) -> int | None:
        """Where the first byte after `start` that is cached or being fetched begins: a new
        window stops there, so concurrent walkers of one shard never fetch a byte twice."""
        starts = [b.start for b in self._blocks.get(key, ()) if b.start > start]
        starts += [s for s, _, _ in self._inflight.get(key, ()) if s > start]
        return min(starts, default=None)

    def _store(self, key: str, start: int, data: bytes) -> None:
        if not data or len(data) > self.cache_bytes:
            return
        # keep blocks disjoint: drop any cached block the new one overlaps
        end = start + len(data)
        for old in [b for b in self._blocks.get(key, ()) if b.start < end and b.end > start]:
            self._drop(key, old)
        blocks = self._blocks.setdefault(key, [])  # (dropping may have removed the key's list)
        blocks.insert(bisect.bisect_left([b.start for b in blocks], start), _Block(start, data))
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

    # -- Store

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None) -> bytes | None:
        if start < 0 or length is None:  # suffix (index) and whole-key reads: exact
            return await self._fetch(key, start, length)
        end = start + length
        while True:
            hit = self._lookup(key, start, end)
            if hit is not None:
                return hit
            waiting = next((ev for s, e, ev in self._inflight.get(key, []) if s <= start and end <= e), None)
            if waiting is None:
                break
            await waiting.wait()
        seen = self._reads.get(key, 0)
        self._reads[key] = seen + 1
        if len(self._reads) > 4096:
            self._reads.pop(next(iter(self._reads)))
        want = max(end, extent or end, start + self.window if seen else end)
        stop = self._next_held(key, start)
        if stop is not None and stop >= end:
            want = min(want, stop)
        if want == end and extent is None and not seen:
            return await self._fetch(key, start, length)
        done = trio.Event()
        flight = (start, want, done)
        self._inflight.setdefault(key, []).append(flight)
        try:
            data = await self._fetch(key, start, want - start)
        finally:
            self._inflight[key].remove(flight)
            if not self._inflight[key]:
                del self._inflight[key]
            done.set()
        if data is None:
            return None
        self._store(key, start, data)
        return data[:length]

    async def _fetch(self, key: str, start: int, length: int | None) -> bytes | None:
        self.requests += 1
        data = await self.inner.read(key, start, length)
        self.bytes += len(data or b"")
        return data

    async def size(self, key: str) -> int | None:
        return await self.inner.size(key)

    async def list(self, prefix: str) -> list[Entry] | None:
        return await self.inner.list(prefix)

    async def aclose(self) -> None:
        await self.inner.aclose()
