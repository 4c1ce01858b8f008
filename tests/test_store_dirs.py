"""Directories shown as stored, without FUSE (`StoreDir` over a local store): a listing kept
is checked against the directory when a name looked up is not in it, and names keep their
inode numbers when their directory changes."""

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


def _slow_dir(tmp_path, delay: float):
    """A local store of 50 files whose listing takes `delay` seconds: the store, the prefixes
    it lists from now on, its tree and root directory."""
    for i in range(50):
        (tmp_path / f"f{i:03d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    listed = _counted(store, delay)
    return store, listed, *_root_dir(store)


async def test_names_keep_their_numbers_when_their_directory_changes(tmp_path):
    """A random writer adds files, removes some and puts directories in place of others, a
    reader looks up each new file, 300 times (each lookup lists the directory again): every
    name still there answers to the number it had, by name and by number; a name gone, or
    that is now a directory, answers nothing by its old number (never another file); and
    the tree holds a few blocks of numbers, not one per listing. Before, each listing with
    other names numbered all of it afresh: every number the kernel held was `Stale`, and it
    looked each name up again (two `ls -l` of 100,000 names under a writer: over 60 s)."""
    import random

    rng = random.Random(22)
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)
    numbers: dict[str, int] = {}  # file name -> the number it first had
    try:
        for i in range(300):
            name = f"f{rng.randrange(10**6):06d}_{i}"  # (sorting anywhere among the others)
            (tmp_path / name).write_bytes(b"%d" % i)
            files = sorted(n for n in numbers if (tmp_path / n).is_file())
            if files and rng.random() < 0.3:
                (tmp_path / rng.choice(files)).unlink()
            elif files and rng.random() < 0.15:
                old = tmp_path / rng.choice(files)
                old.unlink()
                old.mkdir()
            node = await d.lookup(name)
            assert node is not None and node.key == name and not node.is_dir
            numbers.setdefault(name, node.ino)
            if i % 30 == 29:
                for known, ino in numbers.items():
                    path = tmp_path / known
                    by_number = await tree.node(ino)
                    if path.is_file():
                        assert by_number is not None and by_number.key == known and not by_number.is_dir
                        assert (await d.lookup(known)).ino == ino
                    else:
                        assert by_number is None, (known, by_number)
                        if path.is_dir():
                            assert (await d.lookup(known)).ino != ino
        assert len(tree._ranges) <= 3, len(tree._ranges)
    finally:
        await store.aclose()


async def test_a_directory_that_churns_past_its_numbers_is_numbered_afresh(tmp_path, monkeypatch):
    """Numbers of names gone are never reused, so a directory whose names keep changing is
    numbered afresh once the numbers it handed out pass twice its size (plus a block): the
    old numbers are `Stale` then, and the tree keeps no blocks of them."""
    from zvfs.tree import nodes

    monkeypatch.setattr(nodes, "NEW_NAMES_BLOCK", 8)
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)
    old = []
    try:
        for i in range(60):
            (tmp_path / f"f{i:03d}").write_bytes(b"")
            (tmp_path / f"f{i - 4:03d}").unlink(missing_ok=True)  # (5 names at a time)
            node = await d.lookup(f"f{i:03d}")
            assert node is not None and node.key == f"f{i:03d}"
            old.append(node.ino)
        assert len(tree._ranges) <= 3, len(tree._ranges)
        with pytest.raises(Stale):
            await tree.node(old[0])
        assert (await tree.node(old[-1])).key == "f059"
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

    store, listed, tree, d = _slow_dir(tmp_path, delay=0.5)
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


async def test_a_costly_listing_is_made_again_while_the_kept_one_answers(tmp_path, monkeypatch):
    """A directory that takes 0.5 s to list (here a slowed listing), made again by age (files
    changed in place): lookups and getattrs of the names it holds waited for each new listing
    (2 `ls -l` of 100,000 names on a loaded machine took up to 148 s a round, each listing
    16-18 s). The kept one answers them now while the new one is made; then the new one."""
    import trio

    from zvfs.tree import nodes

    monkeypatch.setattr(nodes, "RELIST_SPACING", 3)  # (made again by age every 1.5 s)
    store, listed, tree, d = _slow_dir(tmp_path, delay=0.5)
    try:
        assert await d.lookup("f007") is not None and len(listed) == 1
        (tmp_path / "f007").write_bytes(b"changed in place")
        await trio.sleep(1.6)
        start = trio.current_time()
        node = await d.lookup("f007")
        assert trio.current_time() - start < 0.25 and await node.size() == 0  # (the kept one, at once)
        await trio.sleep(0.05)
        assert len(listed) == 2  # (the new one under way)
        for _ in range(20):  # (asked again meanwhile: the kept one, no third listing)
            assert await (await d.lookup("f012")).size() == 0
        assert len(listed) == 2
        await trio.sleep(0.7)
        assert await (await d.lookup("f007")).size() == len(b"changed in place")
        (tmp_path / "new").write_bytes(b"")  # (a name it does not hold waits for a listing, once due)
        await trio.sleep(1.6)
        assert (await d.lookup("new")).key == "new"
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


async def test_a_handle_opened_past_the_budget_shares_the_listing_others_hold(tmp_path, monkeypatch):
    """Directory handles hold their listing (rows for the kernel's readdir), all together
    within a budget, and a directory's listings beyond it, two at most. A directory listed
    again while handles held its last listing: the new one did not fit beside it, and a
    handle opened then was EIO (an outside attacker: most of 6 `ls -l` at once of 100,000
    names under a writer). Now the new one is held beside the one held; past two, a handle
    gets the newest held if it was current a short while ago (`SHARED_MAX_AGE`), with the
    same numbers; if not, the handles that hold them are waited for, at most the patience
    (handles overlapping for good would see no change), then it gets the newest all the
    same; once one closes, the new one."""
    import trio

    from zvfs.tree import nodes

    for i in range(200):
        (tmp_path / f"f{i:03d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)

    async def gained(name: str) -> None:
        (tmp_path / name).write_bytes(b"")
        assert (await d.lookup(name)).key == name  # (listed again)

    try:
        tree.rows_budget.max_bytes = 100  # (listings only beyond the budget)
        first = await d.rows()
        await gained("g000")
        second = await d.rows()  # (beside the first)
        assert "g000" in second.names and "g000" not in first.names
        assert second.window(5, 6)[1] == first.window(5, 6)[1]
        assert (await tree.node(second.window(5, 6)[1][0])).key == "f005"
        await gained("g001")
        third = await d.rows()  # (no room: the newest held, current a moment ago)
        assert third.listing is second.listing
        for rows in (first, second, third):
            rows.release()
        fourth = await d.rows()
        assert "g001" in fourth.names and fourth.window(5, 6)[1] == first.window(5, 6)[1]
        await gained("g002")
        fifth = await d.rows()
        monkeypatch.setattr(nodes, "SHARED_MAX_AGE", 0.5)  # (times a second: 0.5 s)
        await trio.sleep(0.6)
        await gained("g003")  # (the ones held are older than that: not given at once)
        tree.listings.patience = 1.0
        start = trio.current_time()
        sixth = await d.rows()  # (the handles holding them waited for, the patience; then older, not EIO)
        assert 1.0 <= trio.current_time() - start < 1.5
        assert sixth.listing is fifth.listing and "g002" in sixth.names and "g003" not in sixth.names
        got = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(got, d.rows()))
            await trio.sleep(0.3)
            assert not got
            fourth.release()  # (its `ls` ends)
        assert "g003" in got[0].names
    finally:
        await store.aclose()


async def test_a_listing_beyond_the_budget_leaves_the_budget_to_the_others(tmp_path):
    """One listing larger than the budget of open directory handles was held only alone:
    while `ls -l` of a directory of 100,000 names ran, every `ls` of a small directory beside
    it was EIO, and the reverse (400 of 400, measured). It is held beyond the budget now, the
    others within it; a second such listing (another directory's) waits for it, at most the
    patience."""
    import trio

    from zvfs.tree.nodes import ListingTooLarge

    for name, n in (("big", 400), ("big2", 400), ("s1", 5), ("s2", 5), ("s3", 5)):
        (tmp_path / name).mkdir()
        for i in range(n):
            (tmp_path / name / f"f{i:03d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    tree, _ = _root_dir(store)
    big, big2, *small = (tree.store_dir(store, name) for name in ("big", "big2", "s1", "s2", "s3"))
    try:
        budget = tree.rows_budget
        budget.max_bytes = 2 * (await small[0].listing()).nbytes + 100  # (two small ones)
        assert (await big.listing()).nbytes > budget.max_bytes
        held = await big.rows()
        first, second = await small[0].rows(), await small[1].rows()
        assert len(held.names) == 400 and len(first.names) == len(second.names) == 5
        tree.listings.patience = 1.0
        start = trio.current_time()
        with pytest.raises(ListingTooLarge):  # (the budget full, the one beyond it held)
            await small[2].rows()
        assert 1.0 <= trio.current_time() - start < 1.5
        held.release()
        other = await big2.rows()  # (beyond, beside the two small ones)
        assert len(other.names) == 400
        for rows in (first, second):
            rows.release()
        kept = await small[0].rows()
        got = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(got, big.rows()))
            await trio.sleep(0.3)
            assert not got  # (big2's handle is open)
            other.release()  # (its `ls` ends)
        assert len(got[0].names) == 400 and len(kept.names) == 5
    finally:
        await store.aclose()


async def _append(out: list, awaitable) -> None:
    out.append(await awaitable)


async def test_a_file_node_kept_answers_with_its_size_now(tmp_path):
    """A node the tree keeps from a lookup (the kernel asks for it by number right after)
    answered getattr with its file's size at that lookup, however long ago (an outside
    attacker: `stat` showed a size 7-12 s old). Made current now, from the listing (at most a
    second old), and not stored once its name is gone."""
    import trio

    (tmp_path / "f").write_bytes(b"x" * 10)
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)
    try:
        node = await d.lookup("f")
        tree.remember(node)
        with open(tmp_path / "f", "ab") as f:  # (in place: the directory's times stay)
            f.write(b"y" * 90)
        await trio.sleep(1.1)
        kept = await tree.node(node.ino)
        assert await kept.revalidate() and await kept.size() == 100
        (tmp_path / "f").unlink()
        await trio.sleep(1.1)
        assert not await kept.revalidate()
    finally:
        await store.aclose()


async def test_a_listing_made_again_unchanged_is_the_same_listing(tmp_path):
    """A listing is made again each second it is used (sizes of files changed in place); one
    that found nothing changed is the listing kept, not a copy: directory handles of a huge
    directory held copies that did not fit beside each other, and `ls -l` of it was EIO
    while one file in it changed now and then (an outside attacker, 12 of 70 rounds)."""
    import trio

    for i in range(50):
        (tmp_path / f"f{i:02d}").write_bytes(b"")
    store = LocalStore(str(tmp_path))
    tree, d = _root_dir(store)
    listed = _counted(store)
    try:
        first = await d.rows()
        await trio.sleep(1.1)
        assert (await d.lookup("f07")).key == "f07"  # (made again: older than a second)
        assert len(listed) == 2 and await d.listing() is first.listing
        (tmp_path / "f07").write_bytes(b"changed in place")
        await trio.sleep(1.1)
        assert (await d.lookup("f07")).key == "f07"
        current = await d.listing()
        assert len(listed) == 3 and current is not first.listing and current.sizes[7] == len(b"changed in place")
    finally:
        await store.aclose()
