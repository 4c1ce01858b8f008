"""The command line: ls / cat / inspect without mounting, bad sources, mount options,
`mount -t fuse.zvfs`, umount."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import writers
import zarr_reference as R
from conftest import WRITER_ARRAYS, force_unmount, is_mounted, run_zvfs, writer_array_id

LS_DIRS = ["", "dtypes", "dtypes/uint16_gzip", "dtypes/uint16_gzip/c", "dtypes/uint16_gzip/c/0",
           "keys/v2_dot", "keys/default_dot", "keys/v2_slash", "keys/v2_slash/0", "dims/d0",
           "dims/d5/c/0/1", "nested/two_level_3d/c/1", "transpose/t3d/c/0",
           "stored/bytes_after_sharding/c/0", "plain/unsharded_gzip/c", "ome", "ome/labels/cells"]


def _one_line(stderr: bytes) -> str:
    text = stderr.decode(errors="replace").strip()
    assert text, "expected a message on stderr"
    assert "Traceback" not in text, f"traceback on stderr:\n{text}"
    assert "\n" not in text, f"expected one line on stderr, got:\n{text}"
    return text


def _ls_expected(E: R.ExpectedStore, d: str) -> list[str]:
    dirs = E.dirs()
    return [n + "/" if (f"{d}/{n}" if d else n) in dirs else n for n in E.listing(d)]


# ----------------------------------------------------------------------------------------------
# ls


@pytest.mark.parametrize("writer", writers.WRITERS)
@pytest.mark.parametrize("d", LS_DIRS, ids=lambda d: d or "<root>")
def test_ls_equals_mounted_listing(stores, writer, d):
    src = stores.root(writer)
    args = ("ls", src, d) if d else ("ls", src)
    r = run_zvfs(*args)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    lines = r.stdout.decode().splitlines()
    want = _ls_expected(stores.expected(writer), d)
    assert lines == want, "zvfs ls differs from the expected listing"
    mnt = stores.mount(writer)
    listed = [n + "/" if os.path.isdir(mnt / d / n) else n for n in sorted(os.listdir(mnt / d))]
    assert lines == listed, "zvfs ls differs from the mounted directory"


# ----------------------------------------------------------------------------------------------
# cat


def _cat_paths() -> list[tuple[str, str]]:
    picks = ["zarr.json", "consolidated/zarr.json", "ome/zarr.json", "dtypes/uint16_gzip/zarr.json",
             "dtypes/uint16_gzip/c/0/0", "dtypes/uint16_gzip/c/4/5", "dims/d0/c", "dims/d0/zarr.json",
             "keys/v2_dot/1.0", "keys/v2_dot_d0/0", "keys/default_dot/c.3.4", "nested/two_level_2d/c/0/0",
             "transpose/t2d/c/0/0", "stored/bytes_after_sharding/c/0/0",
             "stored/storage_transformer/zarr.json", "plain/unsharded_gzip/c/2/2"]
    return [(w, p) for w in writers.WRITERS for p in picks]


@pytest.mark.parametrize("wp", _cat_paths(), ids=writer_array_id)
def test_cat_equals_mounted_file(stores, wp):
    writer, path = wp
    want = stores.expected(writer).tree()[path]
    r = run_zvfs("cat", stores.root(writer), path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    if isinstance(want, dict):
        assert json.loads(r.stdout) == want
    else:
        assert r.stdout == want
    assert r.stdout == (stores.mount(writer) / path).read_bytes(), "cat differs from the mount"


@pytest.mark.parametrize("path", ["dtypes/uint16_gzip/c/0/1", "dtypes/uint16_gzip/c/0/99", "nope/zarr.json"])
def test_cat_of_an_absent_file_fails_cleanly(stores, path):
    src = stores.root("zarr-python")
    assert path not in stores.expected("zarr-python").tree()
    r = run_zvfs("cat", src, path)
    assert r.returncode != 0
    assert r.stdout == b""
    assert "Traceback" not in r.stderr.decode(errors="replace")


# ----------------------------------------------------------------------------------------------
# inspect --json


@pytest.fixture(scope="session")
def inspect_json(stores):
    cache = {}

    def get(writer):
        if writer not in cache:
            r = run_zvfs("inspect", stores.root(writer), "--json")
            assert r.returncode == 0, r.stderr.decode(errors="replace")
            doc = json.loads(r.stdout)
            cache[writer] = {a["path"]: a for a in doc["arrays"]}
        return cache[writer]

    return get


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_inspect_lists_every_array(stores, inspect_json, writer):
    assert sorted(inspect_json(writer)) == sorted(stores.expected(writer).arrays)


@pytest.mark.parametrize("wa", WRITER_ARRAYS, ids=writer_array_id)
def test_inspect_json_entry(stores, inspect_json, wa):
    writer, path = wa
    case = writers.CASES_BY_PATH[path]
    a = stores.expected(writer).arrays[path]
    e = inspect_json(writer)[path]
    assert e["path"] == path
    assert e["shape"] == list(case.shape)
    assert e["dtype"] == case.dtype
    assert e["sharded"] is case.sharded
    assert e["codecs"] == a.meta["codecs"], "codecs must be the original codec JSON"
    assert isinstance(e["bytes"], int) and e["bytes"] >= 0
    if case.sharded:
        assert e["shard_shape"] == list(case.chunk)
        assert e["shards_present"] == len(a.shard_keys), "shards_present != shard objects in the original"
    else:
        assert e["shard_shape"] is None
    if case.unshardable:
        assert e["unsharded"] is True and e["warning"] is None
        assert e["inner_chunk_shape"] == list(writers.leaf_shape(case)), \
            "inner_chunk_shape should be the (innermost, array-order) unsharded chunk shape"
    elif case.sharded:
        assert e["unsharded"] is False
        assert isinstance(e["warning"], str) and e["warning"].strip()


@pytest.mark.parametrize("wa", [w for w in WRITER_ARRAYS if not writers.CASES_BY_PATH[w[1]].stored_as_is],
                         ids=writer_array_id)
def test_inspect_chunks_present_equals_mounted_chunk_files(stores, inspect_json, wa):
    writer, path = wa
    adir = stores.mount(writer) / path
    n = sum(len(fs) for _, _, fs in os.walk(adir)) - 1  # minus zarr.json
    assert n == len(stores.expected(writer).arrays[path].files)
    assert inspect_json(writer)[path]["chunks_present"] == n


# ----------------------------------------------------------------------------------------------
# bad sources


def _bad_source(tmp_path: Path, kind: str) -> Path:
    src = tmp_path / "bad.zarr"
    if kind == "no_zarr_json":
        (src / "c").mkdir(parents=True)
        (src / "c" / "0").write_bytes(b"x")
    elif kind == "malformed_json":
        src.mkdir()
        (src / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", ')
    elif kind == "not_json_object":
        src.mkdir()
        (src / "zarr.json").write_text("[1, 2, 3]")
    elif kind == "missing":
        pass
    elif kind == "a_file":
        src.write_text("not a store")
    return src


BAD_KINDS = ["no_zarr_json", "malformed_json", "not_json_object", "missing", "a_file"]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_mount_of_a_bad_source_exits_2_with_one_line(tmp_path, kind):
    src = _bad_source(tmp_path, kind)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = run_zvfs("mount", src, mnt, "-o", f"log={tmp_path / 'log'}")
        mounted = is_mounted(mnt)
    finally:
        force_unmount(mnt)
    assert r.returncode == 2, f"exit {r.returncode}; stderr: {r.stderr.decode(errors='replace')}"
    _one_line(r.stderr)
    assert not mounted, "a bad source must not leave anything mounted"


@pytest.mark.parametrize("cmd", ["ls", "inspect", "cat"])
@pytest.mark.parametrize("kind", ["no_zarr_json", "malformed_json", "missing"])
def test_cli_on_a_bad_source_exits_2_with_one_line(tmp_path, kind, cmd):
    src = _bad_source(tmp_path, kind)
    args = {"ls": ("ls", src), "inspect": ("inspect", src, "--json"), "cat": ("cat", src, "zarr.json")}[cmd]
    r = run_zvfs(*args)
    assert r.returncode == 2, f"exit {r.returncode}; stderr: {r.stderr.decode(errors='replace')}"
    _one_line(r.stderr)


# ----------------------------------------------------------------------------------------------
# mount options, umount, mount -t fuse.zvfs


@pytest.mark.parametrize("opt", ["bogus_option", "frobnicate=3"])
def test_unknown_mount_option_is_refused_naming_it(stores, tmp_path, opt):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = run_zvfs("mount", stores.root("zarr-python"), mnt, "-o", f"log={tmp_path / 'log'},{opt}")
        mounted = is_mounted(mnt)
    finally:
        force_unmount(mnt)
    assert r.returncode != 0
    msg = _one_line(r.stderr)
    assert opt.split("=")[0] in msg, f"message does not name the option: {msg}"
    assert not mounted


def test_mount_returns_only_once_live_and_umount_unmounts(stores, tmp_path):
    src = stores.root("zarr-python")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "zvfs.log"
    try:
        r = run_zvfs("mount", src, mnt, "--view", "zarr", "-o", f"log={log}")
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        # no waiting: the mount must be usable right away
        assert os.path.ismount(mnt)
        assert sorted(os.listdir(mnt)) == stores.expected("zarr-python").listing("")
        assert (mnt / "dtypes/uint16_gzip/c/0/0").read_bytes() == \
            stores.expected("zarr-python").tree()["dtypes/uint16_gzip/c/0/0"]
        r = run_zvfs("umount", mnt)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)
    assert log.exists(), "-o log=FILE did not create the daemon log"


ZVFS_LINK = Path("/usr/local/bin/zvfs")


def test_mount_t_fuse_zvfs(stores, tmp_path):
    if not (ZVFS_LINK.exists() and os.access(ZVFS_LINK, os.X_OK)):
        pytest.fail(f"{ZVFS_LINK} is missing: mount.fuse3 only finds programs on the system PATH. "
                    f"Run the project's setup script (it links the venv's zvfs there), or "
                    f"`ln -sf <venv>/bin/zvfs {ZVFS_LINK}`.")
    src = stores.root("zarr-python")
    E = stores.expected("zarr-python")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "fuse.zvfs", str(src), str(mnt), "-o", "ro"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=60)
        assert r.returncode == 0, f"mount -t fuse.zvfs failed: {r.stderr.decode(errors='replace')}"
        assert os.path.ismount(mnt)
        assert sorted(os.listdir(mnt)) == E.listing("")
        for rel in ("dtypes/uint16_gzip/c/0/0", "keys/v2_dot/1.0", "ome/0/c/0/0/0"):
            assert (mnt / rel).read_bytes() == E.tree()[rel], rel
        assert json.loads((mnt / "dtypes/uint16_gzip/zarr.json").read_bytes()) == \
            E.arrays["dtypes/uint16_gzip"].expected_meta
        with open("/proc/mounts") as f:
            types = [ln.split()[2] for ln in f if ln.split()[1] == str(mnt)]
        assert types and types[-1] == "fuse.zvfs", f"mount type {types}"
        r = subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)
