"""Storage layer without FUSE: local byte-range reads and the coalescing index cache."""

from __future__ import annotations

import pytest
import trio

from zvfs.storage.base import Version

from zvfs.errors import CorruptShardError, ShardChanged, StorageError
from zvfs.storage.cache import CoalescingCache
from zvfs.storage.local import LocalStore


@pytest.fixture
def store(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "shard").write_bytes(bytes(range(100)))
    return LocalStore(str(tmp_path), max_open_files=1)


async def test_local_ranges_suffixes_and_missing_keys(store):
    assert await store.read("a/shard", 10, 5) == bytes(range(10, 15))
    assert await store.read("a/shard", -4) == bytes(range(96, 100))
    assert await store.read("a/shard", 98, 10) == bytes([98, 99])  # short past the end
    assert await store.read("a/shard") == bytes(range(100))
    assert await store.read("a/missing", 0, 1) is None
    assert await store.read("a", 0, 1) is None  # a directory is not a key
    entries = await store.list("a")
    assert [(e.name, e.is_dir, e.size) for e in entries] == [("shard", False, 100)]
    assert await store.list("a/shard") is None
    await store.aclose()


async def test_cache_is_bounded_by_bytes():
    cache = CoalescingCache(max_bytes=3 * (100 + 64), sizeof=len)
    loads = []

    def loader(k):
        async def load():
            loads.append(k)
            return b"x" * 100
        return load

    for k in range(5):
        await cache.get(k, loader(k))
    assert cache.nbytes <= 3 * 164
    await cache.get(4, loader(4))  # recent: still cached
    await cache.get(0, loader(0))  # evicted: loaded again
    assert loads == [0, 1, 2, 3, 4, 0]


async def test_concurrent_gets_share_one_load_and_corrupt_results_are_cached():
    cache = CoalescingCache(1 << 20, sizeof=len)
    calls = 0

    async def corrupt():
        nonlocal calls
        calls += 1
        await trio.sleep(0.01)
        raise CorruptShardError("c/0", "bad")

    errors = []

    async def get():
        try:
            await cache.get("k", corrupt)
        except CorruptShardError as e:
            errors.append(e)

    async with trio.open_nursery() as n:
        for _ in range(10):
            n.start_soon(get)
    await get()
    assert calls == 1 and len(errors) == 11


async def test_backend_errors_are_not_cached():
    cache = CoalescingCache(1 << 20, sizeof=len)
    attempts = []

    async def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise StorageError("timeout")
        return b"ok"

    with pytest.raises(StorageError):
        await cache.get("k", flaky)
    assert await cache.get("k", flaky) == b"ok"


def test_which_backend_faults_are_retried():
    """Real exception objects of the backends: server errors, throttling and connection faults
    are transient; permission errors and client errors are not."""
    import aiohttp
    from botocore.exceptions import ClientError, EndpointConnectionError
    from yarl import URL

    from zvfs.storage.remote import transient

    def http(status):
        info = aiohttp.RequestInfo(URL("http://h/k"), "GET", {}, URL("http://h/k"))
        return aiohttp.ClientResponseError(info, (), status=status)

    def s3(code, status):
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert transient(http(503)) and transient(http(500)) and transient(http(429))
    assert not transient(http(403)) and not transient(http(416))
    assert transient(s3("SlowDown", 503)) and transient(s3("Throttling", 400)) and transient(s3("InternalError", 500))
    assert not transient(s3("AccessDenied", 403)) and not transient(s3("InvalidRange", 416))
    assert transient(aiohttp.ServerDisconnectedError()) and transient(aiohttp.ClientPayloadError("cut"))
    assert transient(TimeoutError()) and transient(ConnectionResetError())
    assert transient(EndpointConnectionError(endpoint_url="http://h"))
    assert not transient(ValueError("bad"))


from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300, deadline=None)
@given(reads=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5000), st.integers(1, 700),
                                st.one_of(st.none(), st.integers(0, 6000))), min_size=1, max_size=60),
       window=st.sampled_from([0, 256, 1024, 4096]), cache=st.sampled_from([300, 2048, 1 << 20]))
def test_coalescing_store_returns_the_bytes_of_the_inner_store(reads, window, cache):
    """Any sequence of reads (windows, extents, evictions) returns exactly the inner bytes, and
    the block cache stays consistent and within its bound."""
    import trio

    from zvfs.storage.readahead import CoalescingStore

    files = {k: bytes((i * 7 + len(k)) % 251 for i in range(5000)) for k in ("a", "b")}

    class Inner:
        display = "inner"

        async def read(self, key, start=0, length=None, extent=None, expect=None):
            data = files.get(key)
            if data is None:
                return None
            return data[start:] if length is None else data[start:start + length]

        async def read_version(self, key, start=0, length=None):
            data = await self.read(key, start, length)
            return data, None if data is None else Version(len(files[key]), ("unchanged",))

    async def run():
        store = CoalescingStore(Inner(), window=window, cache_bytes=cache)
        for key, start, length, extent in reads:
            got = await store.read(key, start, length, extent=extent)
            assert got == files[key][start:start + length]
            cached = sum(len(b.data) for blocks in store._blocks.values() for b in blocks)
            assert cached == store._cached <= cache
            assert sorted(store._lru) == sorted((k, b.start) for k, blocks in store._blocks.items() for b in blocks)

    trio.run(run)


async def test_a_chunk_located_in_a_replaced_shard_is_never_read_or_pushed_at_its_old_offsets(tmp_path, monkeypatch):
    """An open locates the chunk, then pins the shard: a shard replaced (rename) in between,
    with the store's descriptor already turned over to the new file by another request, once
    gave a pin of the new file under the old index's offsets, checked against the new
    version: another chunk's bytes (1 read in ~14,000 under tests/test_consistency_stress.py).
    The open must read the chunk as the new shard stores it (or fail), never other bytes; and
    the bytes a walk pushes ahead for the node (as its old version) must be that version's or
    none (they were the new shard's at the old offsets)."""
    import os

    import numpy as np
    import zarr

    import zvfs.storage.local as local
    from zvfs.core.paths import Paths
    from zvfs.core.source import open_source

    monkeypatch.setattr(local, "SETTLE_NS", 0)  # versions settled at once: no evidence re-check to hide the fault
    rng = np.random.default_rng(3)
    stores, chunk = [], {}
    for v, top in enumerate((20, 60000)):  # compressed sizes differ: chunk (1, 1) moves in its shard
        data = rng.integers(0, top, (32, 32), dtype=np.uint16)
        sharded, plain = tmp_path / f"v{v}.zarr", tmp_path / f"v{v}-plain.zarr"
        zarr.create_array(str(sharded), shape=data.shape, shards=(32, 32), chunks=(16, 16), dtype="uint16")[...] = data
        zarr.create_array(str(plain), shape=data.shape, chunks=(16, 16), dtype="uint16")[...] = data
        stores.append(sharded)
        chunk[v] = (plain / "c/1/1").read_bytes()
    assert len(chunk[0]) != len(chunk[1])
    src = await open_source(str(stores[0]))
    try:
        node = await Paths(src).resolve("c/1/1")
        old = node.ref
        assert old.version is not None and old.version.settled and old.evidence is None
        tmp = stores[0] / "c/0/0.tmp"
        tmp.write_bytes((stores[1] / "c/0/0").read_bytes())
        os.replace(tmp, stores[0] / "c/0/0")
        await src.store.current("c/0/0")  # another request sees the new file first
        try:  # what a walk would push into the kernel's cache for the node, as its old version
            pushed = node.bytes_at_hand()
        except ShardChanged:
            pushed = None
        assert pushed is None or bytes(pushed) == chunk[0], "bytes of the new shard at the old offsets"
        handle = await node.open_located(old)
        try:
            assert await handle.read(0, len(chunk[1]) + 1) == chunk[1]
        finally:
            handle.release()
    finally:
        await src.store.aclose()


async def test_a_chunk_located_in_a_file_whose_inode_number_went_to_a_newer_one_is_located_again(tmp_path, monkeypatch):
    """A filesystem gives a freed inode's number to the next new file (ext4 at once). A chunk
    located in one version of a shard, the shard replaced twice (the first replacement frees
    the old file once the store lets its descriptor go), the newest file numbered as the old
    one: an open of the old location pinned the newest file as the old version on the number
    alone, and every read was EIO (an outside attacker's 2 ms rename writer: 37-73 per 20 s).
    The open must locate the chunk again and read it as the newest file stores it."""
    import os

    import numpy as np
    import zarr

    import zvfs.storage.local as local
    from zvfs.core.paths import Paths
    from zvfs.core.source import open_source

    monkeypatch.setattr(local, "SETTLE_NS", 0)  # versions settled at once (the old location stands as is)
    rng = np.random.default_rng(4)
    stores, chunk = [], {}
    for v in range(3):
        data = rng.integers(0, 60000, (32, 32), dtype=np.uint16)
        sharded, plain = tmp_path / f"v{v}.zarr", tmp_path / f"v{v}-plain.zarr"
        zarr.create_array(str(sharded), shape=data.shape, shards=(32, 32), chunks=(16, 16), dtype="uint16")[...] = data
        zarr.create_array(str(plain), shape=data.shape, chunks=(16, 16), dtype="uint16")[...] = data
        stores.append(sharded)
        chunk[v] = (plain / "c/1/1").read_bytes()
    shard = stores[0] / "c/0/0"
    src = await open_source(str(stores[0]))
    try:
        node = await Paths(src).resolve("c/1/1")
        old = node.ref
        number = shard.stat().st_ino
        assert old.version is not None and old.version.tag[1] == number
        tmp = stores[0] / "c/0/0.tmp"
        tmp.write_bytes((stores[1] / "c/0/0").read_bytes())
        os.replace(tmp, shard)
        await src.store.current("c/0/0")  # the old file's descriptor let go of: its number is free
        kept = []
        for k in range(50):  # the next new file gets it (ext4 hands out the lowest free number)
            tmp.write_bytes((stores[2] / "c/0/0").read_bytes())
            if tmp.stat().st_ino == number:
                break
            kept.append(tmp.rename(stores[0] / f"c/0/other{k}"))
        assert tmp.stat().st_ino == number, "the filesystem did not give the freed inode number to a new file"
        os.replace(tmp, shard)
        await src.store.current("c/0/0")  # the store's descriptor is the newest file's (the same number)
        handle = await node.open_located(old)
        try:
            assert await handle.read(0, len(chunk[2]) + 1) == chunk[2]
        finally:
            handle.release()
    finally:
        await src.store.aclose()


@pytest.mark.parametrize("races", [1, 5, 7, 50])
async def test_a_chunk_whose_shard_is_replaced_each_time_it_is_located_opens_at_the_version_it_settles_on(tmp_path, races):
    """A writer replacing a shard by rename faster than an open locates its chunk and pins the
    shard: each pin finds a newer file than the index read. The open locates the chunk anew
    and reads it as the file it pinned stores it; 7 such races in a row are survived (3
    before: 2 EIO in ~74,000 opens under an outside attacker's 1 ms rename writer), 50 are EIO. The versions alternate between two different arrays,
    so a chunk read at another version's offsets, or from the wrong version, shows."""
    import os

    import numpy as np
    import zarr

    from zvfs.core.paths import Paths
    from zvfs.core.source import open_source

    rng = np.random.default_rng(races)
    shards, chunk = [], {}
    for v in range(2):
        data = rng.integers(0, 60000, (32, 32), dtype=np.uint16)
        data[:16, :16] = v  # chunk c/0/0 compresses differently: the versions' offsets differ
        sharded, plain = tmp_path / f"v{v}.zarr", tmp_path / f"v{v}-plain.zarr"
        zarr.create_array(str(sharded), shape=data.shape, shards=(32, 32), chunks=(16, 16), dtype="uint16")[...] = data
        zarr.create_array(str(plain), shape=data.shape, chunks=(16, 16), dtype="uint16")[...] = data
        shards.append((sharded / "c/0/0").read_bytes())
        chunk[v] = (plain / "c/1/1").read_bytes()
    root = tmp_path / "live.zarr"
    os.rename(tmp_path / "v0.zarr", root)
    shard, tmp = root / "c/0/0", root / "c/0/0.tmp"
    replaced = [0]
    src = await open_source(str(root))
    try:
        node = await Paths(src).resolve("c/1/1")
        pin = src.store.pin

        async def pin_after_a_rename(key, known=None):
            if replaced[0] < races:  # the writer wins the race once more
                replaced[0] += 1
                tmp.write_bytes(shards[replaced[0] % 2])
                os.replace(tmp, shard)
            return await pin(key, known)

        src.store.pin = pin_after_a_rename
        src.store.pin_now = lambda key: None
        tmp.write_bytes(shards[1])
        os.replace(tmp, shard)  # (the node's location is stale: its open locates anew)
        if races == 50:  # (a writer faster than every open: EIO, never a loop for ever)
            with pytest.raises(Exception, match="replaced while being opened"):
                await node.open()
            return
        handle = await node.open()
        try:
            assert await handle.read(0, len(chunk[0]) + 1) == chunk[replaced[0] % 2]
        finally:
            handle.release()
    finally:
        await src.store.aclose()


def test_local_listings_under_way_share_the_memory_budget(tmp_path):
    """A local listing counts what it holds (142 bytes an entry plus its name) in what all
    listings under way hold, within `max_listing`: a directory that fits alone is refused
    while another listing holds the rest (the message says so), lists whole once that one is
    done, and a refused listing gives back what it counted."""
    import os

    from zvfs.errors import DirectoryTooLarge
    from zvfs.storage.base import LISTED_ENTRY

    names = [f"f{i:06d}" for i in range(20_000)]
    (tmp_path / "a").mkdir()
    for name in names:
        os.close(os.open(tmp_path / "a" / name, os.O_CREAT | os.O_WRONLY, 0o644))
    one = sum(LISTED_ENTRY + len(n) for n in names)
    store = LocalStore(str(tmp_path), max_listing=int(one * 1.5))

    async def main() -> None:
        assert sorted(e.name for e in await store.list("a")) == names
        store.listing_budget.take("elsewhere", 0, one)  # another listing under way, as large
        with pytest.raises(DirectoryTooLarge, match="held by other listings under way"):
            await store.list("a")
        assert store.listing_budget.held == one
        store.listing_budget.give_back(one)  # (that listing done)
        assert len(await store.list("a")) == len(names)
        assert store.listing_budget.held == 0
        small = LocalStore(str(tmp_path), max_listing=one // 2)
        with pytest.raises(DirectoryTooLarge, match="raise it to list it"):
            await small.list("a")
        assert small.listing_budget.held == 0

    trio.run(main)


def test_a_wait_past_the_patience_names_the_directory_listed():
    """A listing that takes longer than the store's patience is EIO naming the directory (the
    fifth outside attacker: `<store>/listing: no answer within 5 s`, the cache key's tag in
    place of the directory); a key whose store key comes first is named by it."""

    async def main() -> None:
        cache = CoalescingCache(1 << 20, name="/data/s", patience=0.05)

        async def slow():
            await trio.sleep(1)
            return b""

        with pytest.raises(StorageError, match=r"^/data/s/plain0: no answer within 0.05 s$"):
            await cache.get(("listing", 12345, "plain0"), slow)
        with pytest.raises(StorageError, match=r"^/data/s/a/c/0/0: no answer"):
            await cache.get(("a/c/0/0", ("tag", 1), 0, 0), slow)

    trio.run(main)


async def test_a_listing_that_goes_on_past_the_patience_is_waited_for(tmp_path, monkeypatch):
    """The patience is for a store that does not answer (a hung mount), not for a listing that
    is slow because it is large and the machine busy: a local listing of 100,000 names that
    took more than 5 s on a loaded machine was EIO, and so was every lookup in its directory
    (an `ls -l` loop and a churn run beside it). A listing shows it goes on at each step of
    entries (`PROGRESS`): waited for however long it takes; a load that shows nothing for the
    patience is still given up."""
    import threading
    import time

    from zvfs.storage import local

    for i in range(3000):
        (tmp_path / f"f{i:04d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    real_take = store.listing_budget.take

    def slow_take(*args):  # (each step takes 0.1 s: 3 times the patience in all)
        time.sleep(0.1)
        return real_take(*args)

    monkeypatch.setattr(store.listing_budget, "take", slow_take)
    monkeypatch.setattr(local, "LISTED_ENTRY", 1300)  # (a step every 200 entries: 15 steps)
    cache = CoalescingCache(1 << 20, name=str(tmp_path), patience=0.5)
    try:
        start = trio.current_time()
        entries = await cache.get(("listing", 1, ""), lambda: store.list(""), keep=False)
        assert len(entries) == 3000 and trio.current_time() - start > 1.0
        hung = threading.Event()
        start = trio.current_time()
        with pytest.raises(StorageError, match="no answer within 0.5 s"):
            await cache.get(("listing", 1, "hung"), lambda: trio.to_thread.run_sync(hung.wait, 3))
        assert trio.current_time() - start < 1.0
        hung.set()
    finally:
        await store.aclose()


async def test_a_listing_queued_behind_moving_ones_is_waited_for(tmp_path, monkeypatch):
    """A listing waiting for a thread of its mount shows progress while the queue moves (the
    listings ahead of it show theirs, or finish), so its waiters do not give up at the
    patience: twelve listings of 100,000 names at once were EIO for the four queued behind the
    eight threads. A queue held by a hung call does not move: its waiters still give up."""
    import threading
    import time

    from zvfs.storage import local

    monkeypatch.setattr(local, "THREADS_PER_MOUNT", 1)  # (one thread: the second listing queues)
    monkeypatch.setattr(local, "LISTED_ENTRY", 1300)  # (a step every 200 entries)
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
        for i in range(1200):
            (tmp_path / d / f"f{i:04d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    real_take = store.listing_budget.take

    def slow_take(*args):  # (each step 0.2 s: a listing takes 1.2 s, past the patience of 0.5)
        time.sleep(0.2)
        return real_take(*args)

    monkeypatch.setattr(store.listing_budget, "take", slow_take)
    cache = CoalescingCache(1 << 20, name=str(tmp_path), patience=0.5)
    try:
        got = {}

        async def list_one(d: str) -> None:
            got[d] = await cache.get(("listing", 1, d), lambda: store.list(d), keep=False)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for d in ("a", "b", "c"):
                nursery.start_soon(list_one, d)
        assert {d: len(e) for d, e in got.items()} == {"a": 1200, "b": 1200, "c": 1200}
        assert trio.current_time() - start > 3  # (one after the other)

        hung = threading.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._in_thread, store._lexical_mount(""), hung.wait, 3)
            await trio.sleep(0.05)
            start = trio.current_time()
            with pytest.raises(StorageError, match="no answer within 0.5 s"):
                await cache.get(("listing", 2, "a"), lambda: store.list("a"), keep=False)
            assert trio.current_time() - start < 1.5
            hung.set()
    finally:
        await store.aclose()


async def test_a_listing_larger_than_the_cache_is_not_evicted_by_small_ones():
    """A listing larger than the whole listings cache is kept beside the small ones, which are
    evicted around it; another oversized one replaces it. (Kept alone, the next small listing
    evicted it: the kernel looking up the directories above a huge one made an outside
    attacker's `ls -l` of it list all 100,000 names again and again, for good.)"""
    cache = CoalescingCache(1000, sizeof=len, keep_oversized=True)
    loads = []

    def loader(key, size):
        async def load():
            loads.append(key)
            return b"x" * size
        return load

    await cache.get("huge", loader("huge", 5000))
    for i in range(50):  # small listings, 300 bytes each: three fit beside it
        await cache.get(f"small{i}", loader(f"small{i}", 300))
        assert await cache.get("huge", loader("huge", 5000)) == b"x" * 5000
    assert loads.count("huge") == 1 and cache.nbytes <= 5000 + 1000 + 3 * 64
    await cache.get("other", loader("other", 4000))  # another oversized one replaces it
    assert cache.peek("huge") == (False, None) and cache.peek("other")[0]
    await cache.get("huge", loader("huge", 5000))
    assert loads.count("huge") == 2 and cache.peek("other") == (False, None)
