"""`ListedFiles` without FUSE: the files of recent listings by inode number, and how a walk in
listing order is told from random opens (`following`, what the FUSE front pushes ahead)."""

from __future__ import annotations

import numpy as np

from zvfs.tree.nodes import ListedFiles


class _File:
    def __init__(self, ino: int, row: int):
        self.ino, self.row = ino, row


def _listed(inos, fresh: float = 5.0) -> ListedFiles:
    listed = ListedFiles(fresh=fresh)
    listed.add(np.array(inos, dtype=np.int64), _File)
    return listed


def _inos(files) -> list[int]:
    return [f.ino for f in files]


def test_a_walk_in_order_gets_each_following_file_once():
    listed = _listed(range(100, 110))
    assert _inos(listed.following(100, 4)) == [101, 102, 103, 104]  # row 0 first: a walk starts
    assert _inos(listed.following(101, 4)) == [105]  # 102..104 were handed out already
    assert _inos(listed.following(102, 4)) == [106]
    assert _inos(listed.following(103, 4)) == [107]
    for ino in range(104, 110):
        listed.following(ino, 4)
    assert listed.following(109, 4) == []  # the end of the listing


def test_sparse_numbers_walk_by_row_not_by_number():
    listed = _listed([10, 20, 30, 40, 50, 60])
    assert _inos(listed.following(10, 2)) == [20, 30]
    assert _inos(listed.following(20, 2)) == [40]
    assert listed.get(25) is None and listed.get(40).row == 3


def test_opens_out_of_order_get_nothing():
    listed = _listed(range(100, 120))
    for ino in (119, 118, 117, 105, 103, 101, 100, 110):
        assert listed.following(ino, 4) == [], ino
    assert _inos(listed.following(111, 2)) == [112, 113]  # 111 follows 110: a walk from there


def test_a_new_listing_of_the_same_files_starts_over():
    listed = _listed(range(100, 110))
    assert _inos(listed.following(100, 4)) == [101, 102, 103, 104]
    listed.add(np.arange(100, 110, dtype=np.int64), _File)
    assert _inos(listed.following(100, 4)) == [101, 102, 103, 104]


def test_old_listings_are_not_followed():
    listed = _listed(range(100, 110), fresh=-1.0)  # (older than any age allowed)
    assert listed.get(100) is None
    assert listed.following(100, 4) == []


def test_a_walk_goes_on_into_the_listing_of_the_numbers_that_follow():
    """A chunk directory is listed a few shards at a time, one entry each: a walk reaching the
    end of one gets the first files of the next (each once, and the walk goes on there), but
    not those of a listing whose numbers do not follow, or one already being opened."""
    listed = ListedFiles()
    for lo in (100, 104, 200):
        listed.add(np.arange(lo, lo + 4, dtype=np.int64), _File)
    assert _inos(listed.following(100, 4)) == [101, 102, 103, 104]
    assert _inos(listed.following(101, 4)) == [105]
    assert _inos(listed.following(102, 4)) == [106]
    assert _inos(listed.following(103, 4)) == [107]
    got = listed.get(104)
    assert got is not None and got.ino == 104  # (the file handed out, taken by its open)
    assert _inos(listed.following(104, 4)) == []  # 105..107 handed out; nothing follows 107
    for ino in (105, 106):
        listed.following(ino, 4)
    assert listed.following(107, 4) == []  # 200.. does not follow 107
    other = ListedFiles()
    for lo in (0, 4):
        other.add(np.arange(lo, lo + 4, dtype=np.int64), _File)
    assert other.following(5, 4) == []  # (the second listing opened first, out of order)
    assert _inos(other.following(0, 4)) == [1, 2, 3]  # (so the first's walk does not go on into it)
