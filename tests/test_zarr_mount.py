"""Real-mount tests of the unsharded Zarr v3 view: listings, bytes, sizes, ENOENT, EROFS, inodes, crc.

The expected tree is computed from the ORIGINAL sharded store by decoding the shard indexes in
``zarr_reference`` (independent of zvfs), never from the mount.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
from itertools import product
from pathlib import Path

import pytest

import writers
import zarr_reference as R
from conftest import WRITER_ARRAYS, writer_array_id, zvfs_mount

pytestmark = pytest.mark.mount


def _expected_array(stores, writer, path) -> R.ExpectedArray:
    return stores.expected(writer).arrays[path]


def _read(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read()


# ----------------------------------------------------------------------------------------------
# fixture sanity (no mount): the catalogue really covers what the tests claim


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_fixture_store_has_missing_shards_and_empty_inner_chunks(stores, writer):
    E = stores.expected(writer)
    checked = 0
    for path, a in E.arrays.items():
        case = writers.CASES_BY_PATH[path]
        assert a.kind == ("plain" if not case.sharded else "as_stored" if case.stored_as_is else
                          "unshard"), path
        if a.kind != "unshard" or case.shape == ():
            continue
        shape = case.shape
        shard_grid = [math.ceil(s / c) for s, c in zip(shape, case.chunk)]
        n_shards = math.prod(shard_grid)
        if n_shards >= 3:
            assert len(a.shard_keys) < n_shards, f"{path}: no missing shard"
        leaf = a.expected_meta["chunk_grid"]["configuration"]["chunk_shape"]
        leaf_grid = [math.ceil(s / c) for s, c in zip(shape, leaf)]
        present_shards = set(a.shard_keys)
        ratio = [c // lf for c, lf in zip(case.chunk, leaf)]
        empty_inside = [g for g in product(*map(range, leaf_grid))
                        if R.chunk_key(a.meta, g) not in a.files
                        and R.chunk_key(a.meta, [x // r for x, r in zip(g, ratio)]) in present_shards]
        if math.prod(ratio) >= 2:
            assert empty_inside, f"{path}: no empty inner chunk inside a written shard"
        if any(s % c for s, c in zip(shape, case.chunk)):
            checked += 1
    assert checked >= 10, "too few arrays with edge shards"


# ----------------------------------------------------------------------------------------------
# listings


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_every_directory_lists_exactly_the_expected_entries(stores, writer):
    E = stores.expected(writer)
    mnt = stores.mount(writer)
    bad = []
    for d in sorted(E.dirs()):
        got = sorted(os.listdir(mnt / d))
        want = E.listing(d)
        if got != want:
            bad.append(f"{d or '/'}: extra {sorted(set(got) - set(want))[:8]}, "
                       f"missing {sorted(set(want) - set(got))[:8]}")
    assert not bad, "listings differ:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_array_listing_at_each_level_equals_present_chunks(stores, wa):
    writer, path = wa
    E = stores.expected(writer)
    a = E.arrays[path]
    mnt = stores.mount(writer)
    adir = mnt / path
    for d in [""] + sorted(a.dirs):
        full = f"{path}/{d}" if d else path
        got = sorted(os.listdir(adir / d))
        assert got == E.listing(full), f"listing of {full}"
        for name in got:
            st = os.stat(adir / d / name)
            rel = f"{d}/{name}" if d else name
            if rel in a.dirs:
                assert stat.S_ISDIR(st.st_mode), f"{full}/{name} should be a directory"
            else:
                assert stat.S_ISREG(st.st_mode), f"{full}/{name} should be a regular file"


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_scandir_file_types_match(stores, writer):
    """readdir's d_type agrees with stat (cp -r, find and tar rely on it)."""
    mnt = stores.mount(writer)
    for dirpath, dirnames, filenames in os.walk(mnt):
        with os.scandir(dirpath) as it:
            for e in it:
                st = os.stat(e.path)
                assert e.is_dir(follow_symlinks=False) == stat.S_ISDIR(st.st_mode), e.path
                assert e.is_file(follow_symlinks=False) == stat.S_ISREG(st.st_mode), e.path


# ----------------------------------------------------------------------------------------------
# bytes, sizes, metadata


@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_chunk_files_have_the_inner_chunk_bytes_and_exact_sizes(stores, wa):
    writer, path = wa
    a = _expected_array(stores, writer, path)
    adir = stores.mount(writer) / path
    assert a.files or a.kind == "plain", "fixture array without chunks"
    for key, want in sorted(a.files.items()):
        p = adir / key
        size = os.stat(p).st_size
        got = _read(p)
        assert size == len(got), f"{key}: st_size {size} but read {len(got)} bytes"
        assert got == want, f"{key}: bytes differ from the inner chunk in the original shard" + (
            f" ({a.shard_of.get(key)})" if a.shard_of else "")


@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_array_zarr_json(stores, wa):
    writer, path = wa
    a = _expected_array(stores, writer, path)
    p = stores.mount(writer) / path / "zarr.json"
    raw = _read(p)
    assert os.stat(p).st_size == len(raw), "zarr.json st_size differs from the bytes read"
    if a.kind == "unshard":
        got = json.loads(raw)
        assert got == a.expected_meta
        assert "sharding_indexed" not in json.dumps(got["codecs"])
    else:
        assert raw == a.original_zarr_json, f"{a.kind} array: zarr.json must pass through unchanged"


@pytest.mark.parametrize("writer", writers.WRITERS)
@pytest.mark.parametrize("group", sorted(writers.GROUPS), ids=lambda g: g or "<root>")
def test_group_zarr_json(stores, writer, group):
    E = stores.expected(writer)
    p = stores.mount(writer) / group / "zarr.json"
    raw = _read(p)
    assert os.stat(p).st_size == len(raw)
    got = json.loads(raw)
    want = R.expected_group_meta(E.groups[group])
    assert got.get("attributes") == want.get("attributes"), "group attributes must be identical"
    assert got == want


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_consolidated_metadata_entries_are_the_unsharded_ones(stores, writer):
    E = stores.expected(writer)
    got = json.loads(_read(stores.mount(writer) / "consolidated" / "zarr.json"))
    entries = got["consolidated_metadata"]["metadata"]
    orig = E.groups["consolidated"]["consolidated_metadata"]["metadata"]
    assert sorted(entries) == sorted(orig)
    for k, m in orig.items():
        if m["node_type"] != "array":
            assert entries[k] == m, k
            continue
        assert entries[k] == R.unsharded_meta(m), k
        if R.analyse_meta(m)[0] == "unshard":
            assert "sharding_indexed" not in json.dumps(entries[k]), k
            # (entries are zarr-python's normalized copies: compare the chunking, not all keys)
            own = E.arrays[f"consolidated/{k}"].expected_meta
            assert entries[k]["chunk_grid"] == own["chunk_grid"], k
            assert entries[k]["codecs"] == own["codecs"], k


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_ome_multiscale_attributes_identical(stores, writer):
    root = stores.root(writer)
    mnt = stores.mount(writer)
    for g in ("ome", "ome/labels", "ome/labels/cells"):
        want = json.loads((root / g / "zarr.json").read_bytes())["attributes"]
        got = json.loads(_read(mnt / g / "zarr.json"))["attributes"]
        assert got == want, g
    for level in ("ome/0", "ome/1", "ome/2", "ome/labels/cells/0"):
        want = json.loads((root / level / "zarr.json").read_bytes())
        got = json.loads(_read(mnt / level / "zarr.json"))
        for k in ("attributes", "dimension_names", "shape", "data_type", "fill_value"):
            assert got.get(k) == want.get(k), f"{level}: {k}"


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_whole_tree_has_exact_file_sizes(stores, writer):
    mnt = stores.mount(writer)
    n = 0
    for dirpath, _, filenames in os.walk(mnt):
        for fn in filenames:
            p = Path(dirpath) / fn
            assert os.stat(p).st_size == len(_read(p)), str(p.relative_to(mnt))
            n += 1
    assert n == len(stores.expected(writer).tree())


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_parallel_readers_get_the_same_bytes(stores, writer):
    """8 threads reading every chunk file at once (the FUSE handlers run concurrently)."""
    from concurrent.futures import ThreadPoolExecutor

    mnt = stores.mount(writer)
    tree = {k: v for k, v in stores.expected(writer).tree().items() if isinstance(v, bytes)}
    keys = sorted(tree) * 2
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda k: (k, _read(mnt / k)), keys))
    bad = [k for k, b in results if b != tree[k]]
    assert not bad, f"{len(bad)} files read differently under concurrency, e.g. {bad[:5]}"


# ----------------------------------------------------------------------------------------------
# absent chunks


def _absent_candidates(a: R.ExpectedArray, case: writers.Case) -> list[str]:
    meta = a.expected_meta if a.kind == "unshard" else a.meta
    chunk = meta["chunk_grid"]["configuration"]["chunk_shape"]
    if case.shape == ():
        return []
    grid = [math.ceil(s / c) for s, c in zip(case.shape, chunk)]
    stored = set(a.files)
    absent = [R.chunk_key(meta, g) for g in product(*map(range, grid))
              if R.chunk_key(meta, g) not in stored]
    picks = absent[:6] + absent[-6:] + absent[len(absent) // 2:len(absent) // 2 + 4]
    # past the edge of the grid
    picks.append(R.chunk_key(meta, [grid[0]] + [0] * (len(grid) - 1)))
    picks.append(R.chunk_key(meta, [g - 1 for g in grid[:-1]] + [grid[-1] + 5]))
    return list(dict.fromkeys(picks))


@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_absent_chunks_are_enoent(stores, wa):
    writer, path = wa
    a = _expected_array(stores, writer, path)
    case = writers.CASES_BY_PATH[path]
    adir = stores.mount(writer) / path
    names = _absent_candidates(a, case) + ["no_such_file", "zarr.json.bak"]
    if a.kind == "unshard" and case.shape != ():
        assert len(names) > 4, "fixture should have absent chunks"
    for key in names:
        with pytest.raises(FileNotFoundError):
            os.stat(adir / key)
        with pytest.raises(FileNotFoundError):
            open(adir / key, "rb")
        assert not os.path.exists(adir / key)


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_absent_nodes_are_enoent(stores, writer):
    mnt = stores.mount(writer)
    for rel in ("nope", "dtypes/nope", "dtypes/uint8_raw/c/99", "dtypes/uint8_raw/d/0/0",
                "ome/labels/nope/zarr.json"):
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / rel)


# ----------------------------------------------------------------------------------------------
# read-only


def _expect_erofs(fn, *args):
    with pytest.raises(OSError) as ei:
        fn(*args)
    assert ei.value.errno == errno.EROFS, f"{fn.__name__}{args}: errno {ei.value.errno} " \
                                          f"({errno.errorcode.get(ei.value.errno)}), want EROFS"


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_writes_creates_unlinks_mkdir_are_erofs(stores, writer):
    mnt = stores.mount(writer)
    chunk = mnt / "dtypes/uint16_gzip/c/0/0"
    meta = mnt / "dtypes/uint16_gzip/zarr.json"
    before = _read(chunk), _read(meta)
    _expect_erofs(open, mnt / "new_file", "wb")
    _expect_erofs(open, mnt / "dtypes/uint16_gzip/c/0/9", "wb")
    _expect_erofs(open, chunk, "r+b")
    _expect_erofs(open, chunk, "ab")
    _expect_erofs(open, meta, "wb")
    _expect_erofs(os.unlink, chunk)
    _expect_erofs(os.unlink, meta)
    _expect_erofs(os.mkdir, mnt / "newdir")
    _expect_erofs(os.mkdir, mnt / "dtypes/uint16_gzip/c/0/newdir")
    assert (_read(chunk), _read(meta)) == before
    assert not os.path.exists(mnt / "new_file") and not os.path.exists(mnt / "newdir")


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_rename_rmdir_truncate_link_chmod_are_erofs(stores, writer):
    mnt = stores.mount(writer)
    chunk = mnt / "dtypes/uint16_gzip/c/0/0"
    before = _read(chunk)
    _expect_erofs(os.rename, chunk, mnt / "dtypes/uint16_gzip/c/0/renamed")
    _expect_erofs(os.rmdir, mnt / "dtypes/uint16_gzip/c/0")
    _expect_erofs(os.truncate, chunk, 0)
    _expect_erofs(os.symlink, "zarr.json", mnt / "dtypes/link")
    _expect_erofs(os.link, chunk, mnt / "dtypes/hardlink")
    _expect_erofs(os.chmod, chunk, 0o777)
    assert _read(chunk) == before


# ----------------------------------------------------------------------------------------------
# inodes


def _sample_paths(E: R.ExpectedStore) -> list[str]:
    files = sorted(E.tree())
    dirs = sorted(d for d in E.dirs() if d)
    return files[:: max(1, len(files) // 60)] + dirs[:: max(1, len(dirs) // 20)]


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_inode_numbers_are_stable(stores, writer):
    E = stores.expected(writer)
    mnt = stores.mount(writer)
    paths = _sample_paths(E)
    first = {p: os.stat(mnt / p).st_ino for p in paths}
    again = {p: os.stat(mnt / p).st_ino for p in paths}
    assert again == first, "st_ino changed between two stats"
    for d in sorted(E.dirs()):  # re-list everything (readdirplus refreshes lookups)
        os.listdir(mnt / d)
    for p in paths:  # read some, too
        if not os.path.isdir(mnt / p):
            _read(mnt / p)
    after = {p: os.stat(mnt / p).st_ino for p in paths}
    assert after == first, "st_ino changed after re-listing"


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_inode_numbers_unique_and_match_readdir(stores, writer):
    """Distinct paths have distinct st_ino (du/find/tar treat equal inodes as one file)."""
    mnt = stores.mount(writer)
    seen: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(mnt):
        with os.scandir(dirpath) as it:
            for e in it:
                ino = os.stat(e.path).st_ino
                assert e.inode() == ino, f"{e.path}: readdir d_ino {e.inode()} != st_ino {ino}"
                assert ino not in seen, f"{e.path} and {seen.get(ino)} share st_ino {ino}"
                seen[ino] = e.path


# ----------------------------------------------------------------------------------------------
# crc32c mismatch


def _shard_key_pattern(key: str) -> re.Pattern:
    return re.compile(r"(?<![\w.])" + re.escape(key) + r"(?![\w/.])")


def test_crc_mismatch_gives_eio_for_that_shards_chunks_only(tmp_path):
    src = tmp_path / "store.zarr"
    writers.write_crc_store(src)
    good = R.expected_store(src).arrays["crc/arr"]
    bad_shard = "c/1/1"
    assert bad_shard in good.shard_keys
    bad_chunks = sorted(k for k, s in good.shard_of.items() if s == bad_shard)
    ok_chunks = sorted(k for k, s in good.shard_of.items() if s != bad_shard)
    assert len(bad_chunks) >= 2 and len(ok_chunks) >= 10
    # flip one byte of the first index entry (index at the end, crc32c after it)
    shard = src / "crc/arr" / bad_shard
    buf = bytearray(shard.read_bytes())
    n = 2 * 2  # inner chunks per shard (8,10)/(4,5)
    pos = len(buf) - 4 - 16 * n
    buf[pos] ^= 0x01
    shard.write_bytes(bytes(buf))
    assert R.expected_store(src).arrays["crc/arr"].corrupt_shards == [bad_shard]

    log = tmp_path / "zvfs.log"
    with zvfs_mount(src, tmp_path / "mnt", log=log) as mnt:
        adir = mnt / "crc/arr"
        for _ in range(2):  # twice: the log must still have one line
            for key in bad_chunks:
                with pytest.raises(OSError) as ei:
                    _read(adir / key)
                assert ei.value.errno == errno.EIO, f"{key}: errno {ei.value.errno}, want EIO"
        for key in ok_chunks:
            assert _read(adir / key) == good.files[key], key
        assert json.loads(_read(adir / "zarr.json")) == good.expected_meta
    text = log.read_text(errors="replace")
    pat = _shard_key_pattern(bad_shard)
    lines = [ln for ln in text.splitlines() if pat.search(ln)]
    assert len(lines) == 1, f"want exactly one log line naming {bad_shard}, got {len(lines)}:\n" + \
        "\n".join(lines[:10]) + f"\n--- whole log tail ---\n{text[-2000:]}"


def test_reading_through_the_mount_leaves_the_source_unchanged(tmp_path, stores):
    """Reading through the mount never modifies the source store (atime aside)."""
    src = tmp_path / "store.zarr"
    shutil.copytree(stores.root("zarr-python") / "dims", src / "dims")
    shutil.copy(stores.root("zarr-python") / "zarr.json", src / "zarr.json")
    before = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "log") as mnt:
        for dirpath, _, filenames in os.walk(mnt):
            for fn in filenames:
                _read(Path(dirpath) / fn)
    after = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    assert after == before


def test_nan_and_infinity_in_attributes_are_served_as_written(tmp_path):
    """zarr-python writes `attrs["scale"] = nan` as a bare NaN token (and a float array's NaN
    fill value as "NaN"): the mount shows the array (before: EIO for its directory and its
    zarr.json, with "internal error" tracebacks), its zarr.json parses to the same attributes,
    and zarr-python reads the same attributes and data through the mount."""
    import numpy as np
    import zarr

    src = tmp_path / "store.zarr"
    group = zarr.open_group(src, mode="w")
    a = group.create_array("img", shape=(16, 16), chunks=(4, 4), shards=(8, 8), dtype="f4", fill_value=np.nan)
    a[:8] = np.arange(128, dtype="f4").reshape(8, 16)
    a.attrs.update({"scale": float("nan"), "top": float("inf"), "bottom": float("-inf"), "n": 3})
    group.attrs["offset"] = float("nan")
    assert "NaN" in (src / "img" / "zarr.json").read_text()
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
        shown = json.loads((mnt / "img" / "zarr.json").read_text())
        attrs = dict(zarr.open_array(mnt / "img", mode="r").attrs)
        data = zarr.open_array(mnt / "img", mode="r")[...]
        assert "c" in os.listdir(mnt / "img")
        assert math.isnan(json.loads((mnt / "zarr.json").read_text())["attributes"]["offset"])
    assert math.isnan(shown["attributes"]["scale"]) and shown["attributes"]["top"] == math.inf
    assert shown["attributes"]["bottom"] == -math.inf and shown["attributes"]["n"] == 3
    assert math.isnan(attrs["scale"]) and attrs["top"] == math.inf and attrs["n"] == 3
    assert np.array_equal(data, a[...], equal_nan=True)
    assert "Traceback" not in (tmp_path / "zvfs.log").read_text()
