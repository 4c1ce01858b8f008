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
