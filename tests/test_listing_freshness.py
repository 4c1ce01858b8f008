"""Listings of a local store that changes, without FUSE (`open_source` + the tree).

A listing reuses a shard's version check for at most `LISTING_MAX_AGE` seconds, so `find` over
many directories of one shard row stats each shard once, not once per directory; after that
window a listing shows what is stored. A lookup (an open by name) never reuses a listing's
check. The store is written by zarr-python; what is expected comes from zarr-python reading it.
"""

from __future__ import annotations

import numpy as np
import trio
import zarr

from zvfs.core.source import open_source
from zvfs.storage.cache import LISTING_MAX_AGE

SHAPE, SHARD, INNER = (64, 64), (16, 16), (8, 8)  # 4 x 4 shards of 2 x 2 chunks: chunk grid 8 x 8


def _write(root) -> np.ndarray:
    data = np.random.default_rng(5).integers(1, 255, SHAPE, dtype=np.uint8)
    a = zarr.create_array(str(root), shape=SHAPE, shards=SHARD, chunks=INNER, dtype="uint8",
                          compressors=None, fill_value=0)
    a[...] = data
    return data


def _expected_names(root, row: int) -> list[str]:
    """The chunk columns zarr-python finds non-empty in chunk row `row`."""
    a = zarr.open_array(str(root))
    return [str(j) for j in range(SHAPE[1] // INNER[1])
            if a[row * 8:(row + 1) * 8, j * 8:(j + 1) * 8].any()]


async def _list_rows(tree) -> dict[int, list[str]]:
    out = {}
    for i in range(SHAPE[0] // INNER[0]):
        out[i] = (await (await tree.resolve(f"c/{i}")).rows()).names
    return out


async def test_a_listing_checks_each_shard_once_per_window_and_then_sees_a_deleted_shard(tmp_path):
    src = tmp_path / "store.zarr"
    _write(src)
    opened = await open_source(str(src))
    store, tree = opened.store, opened.tree
    checks = []
    current = store.current

    async def counted(key):
        checks.append(key)
        return await current(key)

    store.current = counted  # type: ignore[method-assign]
    first = await _list_rows(tree)
    assert first == {i: _expected_names(src, i) for i in first}
    assert checks == [], "indexes loaded by this listing were checked by loading them"

    await trio.sleep(LISTING_MAX_AGE + 0.05)
    await _list_rows(tree)  # 8 directories, each spanning the 4 shards of its shard row
    assert sorted(checks) == sorted(f"c/{r}/{c}" for r in range(4) for c in range(4)), checks

    (src / "c" / "0" / "0").unlink()  # chunks (0..1, 0..1) are gone
    assert await tree.resolve("c/0/0") is None, "a lookup checks the shard now, whatever the listings did"
    await trio.sleep(LISTING_MAX_AGE + 0.05)
    after = await _list_rows(tree)
    assert after == {i: _expected_names(src, i) for i in after}
    assert "0" not in after[0] and "1" not in after[1] and "2" in after[0]
