"""Directories shown as stored, without FUSE (`StoreDir` over a local store): a listing kept
is checked against the directory when a name looked up is not in it, and a directory listed
again and again with other names keeps nothing of its old listings' numbers."""

from __future__ import annotations

import pytest

from zvfs.errors import Stale
from zvfs.storage.local import LocalStore
from zvfs.tree.nodes import PassDir, Tree


def _root_dir(store: LocalStore):
    """A tree whose root is the store's root directory shown as stored (as a view's: number 1)."""
    tree = Tree()
    d = tree.store_dir(store, "")
    tree.intern("root", lambda ino: PassDir(ino, d))
    return tree, d


def _counted(store: LocalStore, delay: float = 0.0) -> list[str]:
    """The prefixes `store` lists from now on (each listing slowed by `delay` seconds)."""
    import trio

    listed: list[str] = []
    real_list = store.list

    async def counted(prefix):
        listed.append(prefix)
        await trio.sleep(delay)
        return await real_list(prefix)

    store.list = counted
    return listed


async def test_a_directory_listed_again_and_again_keeps_no_old_numbers(tmp_path):
    """A writer adds a file, a reader looks it up, 300 times: each lookup finds its new file
    (the listing kept lacks it, so the directory is listed again), the numbers of every older
    listing are Stale (never another file's), and the tree holds the current listing's
    numbers only (before, one block of numbers was kept per listing made, for good)."""
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)
    blocks = len(tree._ranges)
    old = []
    try:
        for i in range(300):
            (tmp_path / f"f{i:03d}").write_bytes(b"%d" % i)
            node = await d.lookup(f"f{i:03d}")
            assert node is not None and node.key == f"f{i:03d}"
            old.append(node.ino)
        assert len(tree._ranges) == blocks + 1
        for ino in old[:-1]:
            with pytest.raises(Stale):
                await tree.node(ino)
        assert (await tree.node(old[-1])).key == "f299"
    finally:
        await store.aclose()


async def test_names_that_are_not_there_cost_no_listing(tmp_path):
    """A tool probing for absent names (`.zarray`, `.zattrs`...) in a directory a writer is
    adding to: each probe asked whether the directory changed, found it had (or could not
    tell: changed within 2 s), and listed all of it again. A name that is not there costs a
    stat now; a name that came is listed (it opens at once)."""
    for i in range(2000):
        (tmp_path / f"f{i:05d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    listed = _counted(store)
    tree, d = _root_dir(store)
    try:
        assert await d.lookup("f00000") is not None and len(listed) == 1
        for i in range(200):
            (tmp_path / f"w{i:03d}").write_bytes(b"")  # the writer: the directory never settles
            for probe in (".zarray", ".zattrs", ".zgroup"):
                assert await d.lookup(probe) is None
        assert len(listed) == 1
        assert (await d.lookup("w199")).key == "w199" and len(listed) == 2
    finally:
        await store.aclose()


async def test_a_directory_that_stops_answering_keeps_what_was_known(tmp_path):
    """The check of a kept listing is a stat of its directory, which on a hung mount (NFS, a
    dead FUSE filesystem) never returns: the lookup that asks waits at most the patience,
    and the ones after it, while that stat is still out, are answered from the kept listing
    at once (unbounded, a lookup held its directory in the kernel for good)."""
    import trio

    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"")
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)
    tree.listings.patience = 1.0
    try:
        assert await d.lookup("a") is not None
        hung = trio.Event()

        async def never(prefix):  # (a stat on a hung mount)
            hung.set()
            await trio.sleep_forever()

        store.listing_version = never
        with trio.fail_after(5):
            start = trio.current_time()
            assert await d.lookup("x") is None  # (not in the kept listing: asks, waits the patience)
            assert hung.is_set() and 1.0 <= trio.current_time() - start < 2.0
            start = trio.current_time()
            for name in ("y", "z", "b", "a"):
                assert (await d.lookup(name) is None) == (name in "yz")
            assert trio.current_time() - start < 0.5
    finally:
        await store.aclose()


async def test_a_directory_removed_while_listed_is_gone_not_a_fault(tmp_path):
    """A writer makes and removes a directory (and its parent) over and over while it is
    listed: each listing is the directory's entries or None (not there), never a StorageError
    (EIO: an outside attacker's random writer got EIO for files whose directory had just
    gone, where ENOENT is right)."""
    import shutil
    import threading

    import trio

    store = LocalStore(str(tmp_path))
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            (tmp_path / "p" / "d").mkdir(parents=True, exist_ok=True)
            (tmp_path / "p" / "d" / "f").write_bytes(b"")
            shutil.rmtree(tmp_path / "p", ignore_errors=True)

    thread = threading.Thread(target=writer)
    thread.start()
    seen = {"none": 0, "listed": 0}
    try:
        with trio.move_on_after(3):
            while True:
                for prefix in ("p/d", "p"):
                    got = await store.list(prefix)
                    seen["none" if got is None else "listed"] += 1
    finally:
        stop.set()
        thread.join()
        await store.aclose()
    assert seen["none"] and seen["listed"], seen


async def test_a_listing_that_costs_more_is_made_again_less_often(tmp_path):
    """A directory that takes 0.5 s to list (here a slowed listing), which a writer keeps
    adding to: lookups for 4 s list it once more at most, not once a second, and a name the
    writer adds is found once ten times the listing's cost has passed."""
    import trio

    for i in range(50):
        (tmp_path / f"f{i:03d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    listed = _counted(store, delay=0.5)
    tree, d = _root_dir(store)
    try:
        assert await d.lookup("f000") is not None
        start = trio.current_time()
        i = 0
        while trio.current_time() - start < 4:
            (tmp_path / f"w{i:03d}").write_bytes(b"")
            assert await d.lookup(f"f{i % 50:03d}") is not None
            i += 1
            await trio.sleep(0.05)
        assert len(listed) == 1, len(listed)
        while trio.current_time() - start < 5.5:
            await trio.sleep(0.1)
        assert (await d.lookup("w000")).key == "w000" and len(listed) == 2
    finally:
        await store.aclose()


async def test_a_lookup_takes_no_answer_older_than_itself(tmp_path):
    """A lookup of a name made a moment ago, while another request's check of the directory
    is under way (its stat taken before the name came): the lookup does not take that stale
    answer (it was ENOENT for a file that was there all along: an outside attacker's random
    writer, 8 in 30,000 reads), it asks again and finds the name."""
    import trio

    (tmp_path / "old").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    real_version = store.listing_version

    async def stat_then_wait(prefix):  # (the stat, then a slow return: a loaded machine)
        version = await real_version(prefix)
        await trio.sleep(0.3)
        return version

    tree, d = _root_dir(store)
    try:
        await trio.sleep(2.1)  # (the directory settled: its version is one a stat can match)
        assert await d.lookup("old") is not None
        await trio.sleep(1.1)  # (the listing kept is due for a check)
        store.listing_version = stat_then_wait
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.listing)  # another request's check: stats now, answers in 0.3 s
            await trio.sleep(0.1)
            (tmp_path / "new").write_bytes(b"")
            found = await d.lookup("new")
        assert found is not None and found.key == "new"
    finally:
        await store.aclose()
