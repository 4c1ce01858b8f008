"""The FUSE front's getattr of chunk files, without a kernel (the handler called directly): a
node the tree kept from a lookup or a listing answers with its shard as it is now, not as it
was when the node was made (an outside attacker's `ls -l` under dentry reclaim, a shard
renamed over every 4 ms: 0.5-1% of sizes 2-16 s stale, all from such nodes). The expected
sizes are the chunk files of unsharded copies written by zarr-python with the same codecs."""

from __future__ import annotations

import errno
import os

import numpy as np
import pyfuse3
import pytest
import zarr

from zvfs.core.source import open_source
from zvfs.fronts.fuse import ZvfsOperations


def _write(root, data, sharded: bool) -> None:
    kw = {"shards": (32, 32)} if sharded else {}
    zarr.create_array(str(root), shape=data.shape, chunks=(16, 16), dtype="uint16", **kw)[...] = data


@pytest.mark.parametrize("kept_from", ["lookup", "listing"])
async def test_getattr_of_a_kept_chunk_file_answers_its_shard_as_it_is_now(tmp_path, kept_from):
    rng = np.random.default_rng(3)
    versions = [rng.integers(0, top, (32, 32), dtype=np.uint16) for top in (20, 60000, 300)]
    sizes = []
    for v, data in enumerate(versions):
        _write(tmp_path / f"v{v}.zarr", data, True)
        _write(tmp_path / f"v{v}-plain.zarr", data, False)
        sizes.append(os.path.getsize(tmp_path / f"v{v}-plain.zarr/c/1/1"))
    assert len(set(sizes)) == 3
    store = tmp_path / "v0.zarr"
    src = await open_source(str(store))
    ops = ZvfsOperations(src.tree)
    try:
        row = await src.tree.resolve("c/1")
        if kept_from == "lookup":
            ino = (await ops.lookup(row.ino, b"1")).st_ino
        else:
            rows = await row.rows()
            ino = rows.inos[rows.names.index("1")]
            assert src.tree.listed.get(ino) is not None
        assert (await ops.getattr(ino)).st_size == sizes[0]
        for v in (1, 2):
            tmp = store / "c/0/0.tmp"
            tmp.write_bytes((tmp_path / f"v{v}.zarr/c/0/0").read_bytes())
            os.replace(tmp, store / "c/0/0")
            assert (await ops.getattr(ino)).st_size == sizes[v], f"version {v}"
        # a version without that chunk (all fill value: not stored): ENOENT, not the last size
        # (an outside attacker's `ls -l`: 29-98 of ~900,000 sizes 1-11 s stale); back, its size
        gone = versions[1].copy()
        gone[16:, 16:] = 0
        _write(tmp_path / "gone.zarr", gone, True)
        for shard, size in ((tmp_path / "gone.zarr/c/0/0", None), (tmp_path / "v1.zarr/c/0/0", sizes[1])):
            tmp = store / "c/0/0.tmp"
            tmp.write_bytes(shard.read_bytes())
            os.replace(tmp, store / "c/0/0")
            if size is None:
                with pytest.raises(pyfuse3.FUSEError) as e:
                    await ops.getattr(ino)
                assert e.value.errno == errno.ENOENT
            else:
                assert (await ops.getattr(ino)).st_size == size
    finally:
        await src.store.aclose()
