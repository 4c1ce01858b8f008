"""Chunk directories list exactly the chunks stored, without FUSE (`open_source` + the tree).

A directory's files come from the shard tables: in views whose path fixes the array's leading
axes (Zarr v3, Zarr v2) a directory is one run of each C-sorted table, found by bisection; in
the N5 view (axes reversed) by matching coordinates. Shards too large to tabulate
(`zarr3.TABLE_MAX_CHUNKS`, set to 0 here to take that path) give each directory its rows by
slicing the shard index. A sparse 3-D array written by zarr-python, with directories that span
several shards and shards holding from none to all of their chunks, is listed directory by
directory in every view both ways, also with a transpose before sharding (the index then runs
in another axis order); what is expected is which chunks zarr-python finds non-empty reading
the store back. An edge shard whose index also names chunks past the array's end lists only
the chunks inside it. Small directories are made in one pass over all their tables
(`chunkrows.SMALL_LISTING`), larger ones segment by segment: both are listed, and give the
same rows and the same files.
"""

from __future__ import annotations

import itertools

import crc32c
import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, TransposeCodec

from zvfs.core.source import open_source
from zvfs.errors import MetadataError
from zvfs.formats import zarr3
from zvfs.options import parse_options
from zvfs.views import chunkrows

SHAPE, SHARD, INNER = (48, 32, 40), (16, 16, 8), (4, 4, 4)  # chunk grid 12 x 8 x 10, shards of 4 x 4 x 2 chunks
GRID = tuple(s // c for s, c in zip(SHAPE, INNER))


@pytest.fixture(scope="module", params=["c-order", "transposed"])
def sparse(tmp_path_factory, request):
    """The store, and the chunk coordinates zarr-python finds non-empty in it. "transposed": a
    transpose (2, 0, 1) before sharding, so the shard index runs over axes 2, 0, 1."""
    root = tmp_path_factory.mktemp("rows") / "sparse.zarr"
    rng = np.random.default_rng(11)
    if request.param == "transposed":
        a = zarr.create_array(str(root), shape=SHAPE, chunks=SHARD, dtype="uint16", compressors=None, fill_value=0,
                              serializer=ShardingCodec(chunk_shape=INNER, codecs=[BytesCodec()]),
                              filters=[TransposeCodec(order=(2, 0, 1))])
    else:
        a = zarr.create_array(str(root), shape=SHAPE, shards=SHARD, chunks=INNER, dtype="uint16",
                              compressors=None, fill_value=0)
    data = np.zeros(SHAPE, np.uint16)
    for c in itertools.product(*map(range, GRID)):
        if rng.random() < 0.3 or c[0] == 5:  # chunk row 5 full; shards of other rows partly or not at all
            if not (c[0] < 4 and c[1] < 4):  # the first shard column of rows 0-3: empty
                data[tuple(slice(i * n, (i + 1) * n) for i, n in zip(c, INNER))] = rng.integers(1, 60000, INNER)
    a[...] = data
    back = zarr.open_array(str(root))[...]
    stored = {c for c in itertools.product(*map(range, GRID))
              if back[tuple(slice(i * n, (i + 1) * n) for i, n in zip(c, INNER))].any()}
    return root, stored, request.param == "transposed"


async def _files(node, tree, prefix=()) -> set[tuple[int, ...]]:
    """Every chunk file below `node`, as its path of integers (directories recursed)."""
    rows = await node.rows()
    out = set()
    for name, ino, is_dir in zip(rows.names, rows.inos, rows.is_dir):
        if not name.isdigit():
            continue
        path = (*prefix, int(name))
        out |= await _files(await tree.node(ino), tree, path) if is_dir else {path}
    return out


@pytest.mark.parametrize("made", ["at once", "by segment"])
@pytest.mark.parametrize("rows_from", ["tables", "index slices"])
@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
async def test_every_directory_lists_the_stored_chunks(sparse, view, rows_from, made, monkeypatch):
    root, stored, transposed = sparse
    if rows_from == "index slices":
        monkeypatch.setattr(zarr3, "TABLE_MAX_CHUNKS", 0)
    if made == "by segment":
        monkeypatch.setattr(chunkrows, "SMALL_LISTING", 0)
    if transposed and view == "zarr2":  # Zarr v2 has C and F order only
        with pytest.raises(MetadataError, match="neither C nor F order"):
            await open_source(str(root), parse_options([f"view={view}"]))
        return
    opened = await open_source(str(root), parse_options([f"view={view}"]))
    top = await opened.tree.resolve("c" if view == "zarr" else "")
    listed = await _files(top, opened.tree)
    expected = {c[::-1] for c in stored} if view == "n5" else stored
    assert listed == expected
    for d in range(1, 3):  # and each directory on its own, looked up by name
        for path in sorted({c[:d] for c in expected}):
            node = await opened.tree.resolve("/".join(map(str, ("c", *path) if view == "zarr" else path)))
            assert await _files(node, opened.tree, path) == {c for c in expected if c[:d] == path}


@pytest.mark.parametrize("rows_from", ["tables", "index slices"])
async def test_index_entries_past_the_array_edge_are_not_listed(tmp_path, rows_from, monkeypatch):
    """An edge shard whose index (rewritten here, checksum and all) also names the chunks its
    shard would hold past the array's end: only the chunks inside the array are listed."""
    root = tmp_path / "edge.zarr"
    a = zarr.create_array(str(root), shape=(10, 10), shards=(8, 8), chunks=(4, 4), dtype="uint8",
                          compressors=None, fill_value=0)  # chunk grid 3 x 3; shard (1, 1) holds chunk (2, 2) only
    a[...] = np.arange(1, 101, dtype=np.uint8).reshape(10, 10)
    shard = root / "c" / "1" / "1"
    raw = bytearray(shard.read_bytes())
    entries = np.frombuffer(bytes(raw[-68:-4]), "<u8").reshape(4, 2).copy()
    assert (entries[1:] == np.uint64(2**64 - 1)).all(), "zarr-python wrote chunks past the edge"
    entries[1:] = entries[0]  # chunks (2, 3), (3, 2), (3, 3): the bytes of chunk (2, 2)
    raw[-68:-4] = entries.astype("<u8").tobytes()
    raw[-4:] = crc32c.crc32c(bytes(raw[-68:-4])).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))

    if rows_from == "index slices":
        monkeypatch.setattr(zarr3, "TABLE_MAX_CHUNKS", 0)
    opened = await open_source(str(root))
    assert await _files(await opened.tree.resolve("c"), opened.tree) == set(itertools.product(range(3), range(3)))
    assert await _files(await opened.tree.resolve("c/2"), opened.tree, (2,)) == {(2, 0), (2, 1), (2, 2)}


async def _dirs_rows(root, view: str, top: str) -> dict[str, tuple]:
    """Every chunk directory's rows (all six columns) and, for each file, where its ref points
    and the version it names, taken from the tree's recent listings (what an open uses)."""
    opened = await open_source(str(root), parse_options([f"view={view}"]))
    out = {}

    async def walk(node, path):
        rows = await node.rows()
        window = rows.window(0, len(rows))
        refs = []
        for name, ino, is_dir in zip(window[0], window[1], window[2]):
            if is_dir:
                await walk(await opened.tree.node(ino), f"{path}/{name}")
            elif name.isdigit() or name.startswith("c."):
                got = opened.tree.listed.get(ino)
                refs.append(None if got is None else (got.ino, got.ref.key, got.ref.offset, got.ref.length, got.ref.version))
        out[path] = (*window, refs)

    await walk(await opened.tree.resolve(top), "")
    return out


def _shuffled_scans(monkeypatch, seed: int) -> None:
    """The source hands its tables over in a random order (as concurrent remote reads may)."""
    scan, rng = zarr3.ShardedArray.scan, np.random.default_rng(seed)

    async def shuffled(self, fixed, visit, wanted=None):
        got = []
        await scan(self, fixed, lambda *args: got.append(args))  # (every shard: none is known unwanted)
        for i in rng.permutation(len(got)).tolist():
            visit(*got[i])

    monkeypatch.setattr(zarr3.ShardedArray, "scan", shuffled)


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """A sparse 2-D array with "." chunk keys: its zarr view lists every chunk file in one
    directory (`c.0.0`), from many shards."""
    root = tmp_path_factory.mktemp("rows") / "flat.zarr"
    a = zarr.create_array(str(root), shape=(48, 40), shards=(16, 8), chunks=(4, 4), dtype="uint8", compressors=None,
                          fill_value=0, chunk_key_encoding={"name": "default", "separator": "."})
    rng = np.random.default_rng(5)
    a[...] = rng.integers(1, 255, (48, 40), dtype=np.uint8) * (rng.random((48, 40)) < 0.2)
    return root, None, False


@pytest.mark.parametrize("order", ["as stored", "shuffled"])
@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5", "flat"])
async def test_directories_made_at_once_are_those_made_by_segment(sparse, flat, view, order, monkeypatch):
    """The one-pass listing of small directories and the segment-by-segment one give the same
    rows, in the same order, and the same files to open (every listed file is in the recent
    listings, pointing at the same bytes of the same shard version), whatever order the
    shards' tables come in."""
    root, _, transposed = flat if view == "flat" else sparse
    top = "c" if view == "zarr" else ""
    view = "zarr" if view == "flat" else view
    if transposed and view == "zarr2":
        return
    small = chunkrows.SMALL_LISTING
    monkeypatch.setattr(chunkrows, "SMALL_LISTING", 0)
    by_segment = await _dirs_rows(root, view, top)
    monkeypatch.setattr(chunkrows, "SMALL_LISTING", small)
    if order == "shuffled":
        _shuffled_scans(monkeypatch, 3)
    at_once = await _dirs_rows(root, view, top)
    assert at_once.keys() == by_segment.keys() and (len(at_once) > 10 or root == flat[0])
    for path, rows in at_once.items():
        assert rows[:-1] == by_segment[path][:-1], path
        # (segment by segment, a flat listing keeps only its last shard's files listed: their
        # numbers interleave with the other shards', and a listing replaces the ones it overlaps)
        assert all(b is None or a == b for a, b in zip(rows[-1], by_segment[path][-1])), path
        if view == "zarr":  # (the others' files are transcoded or get a header: made per window, not kept listed)
            assert None not in rows[-1], path


async def test_a_listing_of_values_reads_no_more_shards_of_a_value_it_has(tmp_path):
    """A directory listing the values of an axis needs one chunk per value: once every value a
    shard row spans holds one, no more shards of that row are listed or read (the fourth
    outside attacker: `ls c/` of a 3-D array of 300 x 300 row directories read all 90,000
    shards for 600 names, 149 s). An array of 4 x 1,100 shard rows (more shards than are
    enumerated: found by listing row directories), every shard a copy of one zarr-python
    wrote: `c/` lists its 8 values reading under a quarter of the shards, the n5 view's top
    one value, and a row directory still every one of its 2,200 values."""
    import json
    import os

    one = tmp_path / "one.zarr"
    a = zarr.create_array(str(one), shape=(2, 2, 2), shards=(2, 2, 2), chunks=(1, 1, 2), dtype="uint8",
                          compressors=None, fill_value=0)
    a[...] = np.arange(1, 9, dtype="uint8").reshape(2, 2, 2)
    root = tmp_path / "wide.zarr"
    root.mkdir()
    meta = json.loads((one / "zarr.json").read_text())
    meta["shape"] = [8, 2200, 2]
    (root / "zarr.json").write_text(json.dumps(meta))
    for i in range(4):
        for j in range(1100):
            (root / "c" / str(i) / str(j)).mkdir(parents=True)
            os.link(one / "c" / "0" / "0" / "0", root / "c" / str(i) / str(j) / "0")
    shards = 4 * 1100
    assert shards > zarr3.ENUMERATE_SHARDS
    for view, top, want in (("zarr", "c", [str(v) for v in range(8)]), ("n5", "", ["0"])):
        opened = await open_source(str(root), parse_options([f"view={view}"]))
        before = opened.store.requests
        rows = await (await opened.tree.resolve(top)).rows()
        read = opened.store.requests - before
        assert sorted((n for n in rows.names if n.isdigit()), key=int) == want, view
        assert read < shards // 4, f"{view}: {read} reads for a listing of {len(want)} values"
    opened = await open_source(str(root))
    rows = await (await opened.tree.resolve("c/5")).rows()
    assert sorted(map(int, rows.names)) == list(range(2200))
