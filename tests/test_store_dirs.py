"""Directories shown as stored, without FUSE (`StoreDir` over a local store): a listing kept
is checked against the directory when a name looked up is not in it, and a directory listed
again and again with other names keeps nothing of its old listings' numbers."""

from __future__ import annotations

import pytest

from zvfs.errors import Stale
from zvfs.storage.local import LocalStore
from zvfs.tree.nodes import PassDir, Tree


async def test_a_directory_listed_again_and_again_keeps_no_old_numbers(tmp_path):
    """A writer adds a file, a reader looks it up, 300 times: each lookup finds its new file
    (the listing kept lacks it, so the directory is listed again), the numbers of every older
    listing are Stale (never another file's), and the tree holds the current listing's
    numbers only (before, one block of numbers was kept per listing made, for good)."""
    store = LocalStore(str(tmp_path))
    tree = Tree()
    d = tree.store_dir(store, "")
    tree.intern("root", lambda ino: PassDir(ino, d))  # (as a view's root: number 1)
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
    listed = []
    real_list = store.list

    async def counted(prefix):
        listed.append(prefix)
        return await real_list(prefix)

    store.list = counted
    tree = Tree()
    d = tree.store_dir(store, "")
    tree.intern("root", lambda ino: PassDir(ino, d))
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
    tree = Tree()
    tree.listings.patience = 1.0
    d = tree.store_dir(store, "")
    tree.intern("root", lambda ino: PassDir(ino, d))
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
