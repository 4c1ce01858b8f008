"""Ownership and permissions through real mounts, read by a real non-root user (issue 12,
point 4; issue 10, point 10).

The store is written by zarr-python as root; one shard is then closed to others (0600), the
other stays 0644. Without options a mount shows the store's own read bits, never wider; an
administrator shares on purpose with `umask=` or hands the files to a user with `uid=`;
`allow_root` lets root in but nobody else; without `allow_other` other users see nothing.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import trio
import zarr

from conftest import READER, as_reader, run_zvfs, zvfs_mount
from zvfs.storage import access
from zvfs.storage.local import LocalStore
from zvfs.storage.walk import resolve

pytestmark = pytest.mark.mount

@pytest.fixture(scope="module")
def base():
    """A directory every user can traverse (pytest's own are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="zvfs-perm-"))
    path.chmod(0o755)
    src = path / "store.zarr"
    a = zarr.create_array(str(src), shape=(32, 16), shards=(16, 16), chunks=(8, 8), dtype="uint8",
                          fill_value=0, compressors=None)
    a[...] = np.arange(32 * 16, dtype=np.uint16).reshape(32, 16).astype(np.uint8)
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (src / "c/0/0").chmod(0o600)  # closed to others: its chunks c/0/0, c/0/1, c/1/0, c/1/1
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mount(base: Path, name: str, options):
    mnt = base / name
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    return zvfs_mount(base / "store.zarr", mnt, options=options)


def test_modes_are_never_wider_than_the_store(base, reader):
    with _mount(base, "plain", ["allow_other"]) as mnt:
        closed, open_ = mnt / "c/0/0", mnt / "c/2/0"
        assert closed.stat().st_mode & 0o777 == 0o400 and open_.stat().st_mode & 0o777 == 0o444
        assert as_reader("cat", closed).returncode != 0, "a chunk of a 0600 shard must stay closed to others"
        r = as_reader("cat", open_)
        assert r.returncode == 0 and r.stdout == open_.read_bytes()


def test_a_shard_narrowed_while_mounted_closes_its_files_at_the_next_open(public_tmp, reader):
    """The kernel checks an open against the bits it holds; after the store narrows a shard to
    0600 those are the old version's, and one more open of another user went through (an
    outside attacker: 20 of 20). The open that finds the new version checks its bits again:
    that open is refused already, and so is every later one; root still reads."""
    src = public_tmp / "store.zarr"
    zarr.create_array(str(src), shape=(16, 16), shards=(16, 16), chunks=(8, 8), dtype="uint8",
                      compressors=None)[...] = 7
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    mnt = public_tmp / "mnt"
    mnt.mkdir()
    mnt.chmod(0o755)
    with zvfs_mount(src, mnt, options=["allow_other"]) as mounted:
        chunk = mounted / "c/0/1"
        want = chunk.read_bytes()
        r = as_reader("cat", chunk)
        assert r.returncode == 0 and r.stdout == want  # (the kernel holds the 0444 bits)
        (src / "c/0/0").chmod(0o600)
        first, second = as_reader("cat", chunk), as_reader("cat", chunk)
        assert first.returncode != 0 and not first.stdout, "the first open after the shard was narrowed read it"
        assert second.returncode != 0 and chunk.stat().st_mode & 0o777 == 0o400
        assert chunk.read_bytes() == want  # (root)


#: the files each view makes of the store's `zarr.json`, `a/zarr.json` and `notes.txt`
MADE_OF = {
    "zarr": {"zarr.json": ["zarr.json"], "a/zarr.json": ["a/zarr.json"], "notes.txt": ["notes.txt"]},
    "zarr2": {"zarr.json": [".zattrs", ".zgroup"], "a/zarr.json": ["a/.zarray", "a/.zattrs"], "notes.txt": []},
    "n5": {"zarr.json": ["attributes.json"], "a/zarr.json": ["a/attributes.json"], "notes.txt": []},
}


@pytest.mark.parametrize("view", sorted(MADE_OF))
def test_metadata_and_plain_files_narrowed_while_mounted_follow_the_store(public_tmp, reader, view):
    """An outside attacker: `chmod 0600` of `zarr.json`, `a/zarr.json` and a plain file in the
    store left the metadata every view makes of them (`zarr.json`, `.zattrs`, `.zarray`,
    `attributes.json`: the arrays' attributes) readable to others through an `allow_other`
    mount, 2 of 2, and `zvfs serve` went on serving all three with 200. Random rounds narrow
    and widen a random set of the three; after each, the reader reads through the mount (and
    anyone through serve) exactly the files made of those the store lets them read (a widened
    one once the kernel asks again: here root's open); root reads all."""
    from servers import ZvfsServe

    src = public_tmp / "store.zarr"
    group = zarr.open_group(str(src), mode="w", zarr_format=3)
    group.attrs["secret"] = "top"
    group.create_array("a", shape=(16, 16), shards=(16, 16), chunks=(8, 8), dtype="uint8", compressors=None,
                       attributes={"secret": "a"})[...] = 3
    (src / "notes.txt").write_text("plain secret\n")
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    mnt = public_tmp / "mnt"
    mnt.mkdir()
    mnt.chmod(0o755)
    rng = np.random.default_rng(sum(map(ord, view)))
    made = MADE_OF[view]
    with zvfs_mount(src, mnt, options=["allow_other", f"view={view}"]) as mounted, \
            ZvfsServe(src, "--view", view, log=public_tmp / "serve.log") as server:
        want = {f: (mounted / f).read_bytes() for fs in made.values() for f in fs}
        closed: set[str] = set()
        for round_ in range(4):
            for stored in made:  # (every file read once before the change: the kernel holds its bits)
                for f in made[stored]:
                    as_reader("cat", mounted / f)
                    _http_status(f"{server.url}/{f}")
            closed = {k for k in made if rng.random() < 0.5} if round_ < 3 else set()
            for stored in made:
                (src / stored).chmod(0o600 if stored in closed else 0o644)
            for stored, files in made.items():
                for f in files:
                    if stored in closed:
                        r = as_reader("cat", mounted / f)
                        assert r.returncode != 0 and not r.stdout, f"round {round_}: {f} read after {stored} was narrowed"
                        assert _http_status(f"{server.url}/{f}") == 403, f"round {round_}: {f} served"
                        assert (mounted / f).read_bytes() == want[f]  # (root)
                    else:  # (widened: seen once the kernel asks again, as at root's open: docs/reliability.md)
                        assert (mounted / f).read_bytes() == want[f]
                        r = as_reader("cat", mounted / f)
                        assert r.returncode == 0 and r.stdout == want[f], f"round {round_}: {f}: {r.stderr!r}"
                        assert _http_status(f"{server.url}/{f}") == 200, f"round {round_}: {f} not served"


def _http_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_umask_shares_a_closed_store_on_purpose(base, reader):
    with _mount(base, "umask", ["allow_other", "umask=022"]) as mnt:
        closed = mnt / "c/0/0"
        assert closed.stat().st_mode & 0o777 == 0o444
        assert (mnt / "c").stat().st_mode & 0o777 == 0o555
        r = as_reader("cat", closed)
        assert r.returncode == 0 and r.stdout == closed.read_bytes()


def test_uid_and_gid_hand_the_files_to_a_user(base, reader):
    with _mount(base, "uid", ["allow_other", f"uid={READER}", "gid=0"]) as mnt:
        st = (mnt / "c/0/0").stat()
        assert (st.st_uid, st.st_gid) == (reader, 0)
        r = as_reader("cat", mnt / "c/0/0")  # 0400, and the reader owns it now
        assert r.returncode == 0 and r.stdout == (mnt / "c/0/0").read_bytes()
        assert as_reader("touch", mnt / "c/0/0").returncode != 0  # never a write bit


def test_allow_root_lets_root_in_and_nobody_else(base, reader):
    with _mount(base, "root", ["allow_root"]) as mnt:
        assert sorted(p.name for p in mnt.iterdir()) == ["c", "zarr.json"]
        r = as_reader("ls", mnt)
        assert r.returncode != 0 and b"ermission denied" in r.stderr
    with _mount(base, "private", []) as mnt:
        assert as_reader("ls", mnt).returncode != 0


@pytest.fixture(scope="module")
def closed_store():
    """Arrays behind a 0700 group, in a 0700 array directory, with a 0700 `c/`, and with a 0700
    shard row directory (`c/0/`), beside an open one; files 0644 everywhere."""
    path = Path(tempfile.mkdtemp(prefix="zvfs-closed-"))
    path.chmod(0o755)
    src = path / "store.zarr"
    root = zarr.open_group(str(src), mode="w", zarr_format=3)
    data = np.arange(32 * 32, dtype=np.uint16).reshape(32, 32).astype(np.uint8) + 1
    for name in ("open/a", "private/b", "locked_array", "locked_c", "locked_row"):
        parent, _, leaf = name.rpartition("/")
        group = root.require_group(parent) if parent else root
        group.create_array(leaf, shape=(32, 32), shards=(16, 16), chunks=(8, 8), dtype="uint8", fill_value=0,
                           compressors=None, dimension_names=["y", "x"])[...] = data
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for closed in ("private", "locked_array", "locked_c/c", "locked_row/c/0"):
        (src / closed).chmod(0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_a_reader_reads_through_the_mount_exactly_what_the_store_lets_them(closed_store, reader, view):
    """Through an allow_other mount, another user reads every file under the open array and
    none under a 0700 directory at any level (group, array, `c/`, a shard's row directory),
    in every view; root reads them all. (Before: directories showed 0555 whatever the store
    said, and only 0600 files stayed closed.)"""
    mnt = closed_store / f"mnt-{view}"
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    with zvfs_mount(closed_store / "store.zarr", mnt, options=["allow_other", f"view={view}"]):
        files = {top: sorted(p for p in (mnt / top).rglob("*") if p.is_file())
                 for top in ("open", "private", "locked_array", "locked_c", "locked_row")}
        for top, found in files.items():
            assert found, f"{view}: root sees no files under {top}"
            chunks = [p for p in found if p.name not in ("zarr.json", ".zarray", ".zattrs", ".zgroup", "attributes.json")]
            assert chunks, f"{view}: no chunk files under {top}"
            readable = [p for p in found if as_reader("cat", p).returncode == 0]
            if top == "open":
                assert readable == found, f"{view}: the reader cannot read {sorted(set(found) - set(readable))[:3]}"
            elif top == "locked_c":  # the metadata beside `c/` is open in the store too
                assert readable == [p for p in found if p not in chunks], (view, readable[:3])
            elif top == "locked_row":  # only the chunks of the shards in c/0/ are closed
                closed = [p for p in chunks if p not in readable]
                assert closed and all(p in readable for p in found if p not in chunks), (view, closed[:3])
                # (N5 reverses the axes: each chunk directory spans both rows, and is closed with one)
                want = 16 if view == "n5" else 8
                assert len(closed) == want, f"{view}: {len(closed)} chunk files closed, expected {want} (c/0/ is closed)"
            else:
                assert not readable, f"{view}: the reader reads {readable[:3]} under the closed {top}"


# ==============================================================================================
# Symlinks and POSIX ACLs: nothing wider than the store, whatever shape the path has
#
# The attacks these answer (before: 257 files of a 0700 array read through `linkarr ->
# private/arr`, the same through a symlinked `c/`, one symlinked shard, a pass-through link;
# 64/64 chunk files under a row directory whose ACL denies the reader): a reader must search
# every directory in which the kernel looks a name up, on the link's path and on its target's
# (storage/walk.py), and an ACL entry that grants someone less than the mode bits narrows the
# whole class (storage/access.py). The oracle of every test below is the store itself: what the
# reader opens through the mount it must be able to open in the store, by the same path.

FOREIGN_UID, FOREIGN_GID = 4242, 4243  # a user and a group that are not the reader's
META = {"zarr.json", ".zarray", ".zattrs", ".zgroup", "attributes.json"}
SYSTEM_PYTHON = "/usr/bin/python3"  # (the test's own interpreter may live where the reader cannot go)

READER_CHECK = r"""
import json, os, sys
out = {}
for kind, path in json.load(sys.stdin):
    try:
        if kind == "list":
            os.listdir(path)
        elif kind == "x":
            if not os.access(path, os.X_OK):
                raise PermissionError(13, "x")
        elif kind == "r":
            if not os.access(path, os.R_OK):
                raise PermissionError(13, "r")
        else:
            with open(path, "rb") as f:
                f.read()
        out[kind + ":" + path] = True
    except OSError as e:
        out[kind + ":" + path] = e.errno
print(json.dumps(out))
"""


def reader_can(items: list[tuple[str, object]]) -> dict[tuple[str, str], bool]:
    """For each (kind, path): whether the reader user can do it ("read" a file whole, "list" a
    directory, "r"/"x" by access(2)); all in one process of the reader's."""
    items = [(k, str(p)) for k, p in items]
    r = subprocess.run(["runuser", "-u", READER, "--", SYSTEM_PYTHON, "-c", READER_CHECK],
                       input=json.dumps(items).encode(), capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    got = json.loads(r.stdout)
    return {(k, p): got[f"{k}:{p}"] is True for k, p in items}


def reader_ids() -> tuple[int, int]:
    pw = pwd.getpwnam(READER)
    return pw.pw_uid, pw.pw_gid


def acl_blob(entries: list[tuple[int, int, int]]) -> bytes:
    """system.posix_acl_access bytes of (tag, perm, id) entries (sorted as the kernel wants)."""
    entries = sorted(entries, key=lambda e: (e[0], e[2] if e[0] in (access.ACL_USER, access.ACL_GROUP) else 0))
    return struct.pack("<I", access.ACL_XATTR_VERSION) + b"".join(
        struct.pack("<HHI", tag, perm, ident if tag in (access.ACL_USER, access.ACL_GROUP) else 0xFFFFFFFF)
        for tag, perm, ident in entries)


_SPEC_TAGS = {"u": (access.ACL_USER_OBJ, access.ACL_USER), "g": (access.ACL_GROUP_OBJ, access.ACL_GROUP),
              "m": (access.ACL_MASK, access.ACL_MASK), "o": (access.ACL_OTHER, access.ACL_OTHER)}


def set_acl(path, spec: str) -> None:
    """Give PATH exactly the ACL `spec` (setfacl's syntax with numeric ids: "u::rwx,u:999:---,
    g::r-x,m::r-x,o::r-x"): with setfacl (Debian's `acl`) when installed, else os.setxattr."""
    if shutil.which("setfacl"):
        subprocess.run(["setfacl", "-n", "--set", spec, str(path)], check=True, capture_output=True)
        return
    entries = []
    for item in spec.split(","):
        kind, ident, perm = item.split(":")
        bits = sum(b for b, c in zip((4, 2, 1), perm) if c != "-")
        obj, named = _SPEC_TAGS[kind]
        entries.append((named if ident else obj, bits, int(ident) if ident else 0))
    os.setxattr(path, access.ACL_ACCESS, acl_blob(entries))


# -- POSIX ACLs against the kernel, without a mount ----------------------------------------------


def test_narrowed_acl_bits_are_never_wider_than_the_kernel_grants(public_tmp, reader):
    """Random ACLs (named entries for the reader, its group, a foreign user and group; with and
    without a mask) on files and directories owned by the reader, by its group, or by neither:
    wherever `access.narrowed` gives the reader's class read (or search) bits, the kernel lets
    the reader read (or search) the node; and it does not simply close everything."""
    uid, gid = reader_ids()
    rnd = random.Random(12)
    cases, checks = {}, []
    for n in range(400):
        is_dir = n % 2 == 1
        path = public_tmp / f"n{n}"
        if is_dir:
            path.mkdir()
        else:
            path.write_bytes(b"x")
        owner, group = rnd.choice([(0, 0), (uid, 0), (0, gid), (uid, gid)])
        os.chown(path, owner, group)
        entries = [(access.ACL_USER_OBJ, rnd.randrange(8), 0), (access.ACL_GROUP_OBJ, rnd.randrange(8), 0),
                   (access.ACL_OTHER, rnd.randrange(8), 0)]
        for tag, ident in ((access.ACL_USER, uid), (access.ACL_GROUP, gid), (access.ACL_USER, FOREIGN_UID),
                           (access.ACL_GROUP, FOREIGN_GID), (access.ACL_USER, owner or 1)):
            if rnd.random() < 0.35 and all((t, i) != (tag, ident) for t, _, i in entries):
                entries.append((tag, rnd.randrange(8), ident))
        if any(t in (access.ACL_USER, access.ACL_GROUP) for t, _, _ in entries) or rnd.random() < 0.3:
            entries.append((access.ACL_MASK, rnd.randrange(8), 0))
        os.setxattr(path, access.ACL_ACCESS, acl_blob(entries))
        st = os.stat(path)
        raw = access.acl_of(str(path))  # (None where the ACL says no more than the mode: not kept)
        assert raw is None or access.parse_acl(raw) is not None
        shown = access.narrowed(stat.S_IMODE(st.st_mode), raw, st.st_uid)
        cls = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0  # the reader's class as the mount shows it
        cases[str(path)] = (shown >> cls) & 7
        checks += [("r", path), ("x", path)]
    got = reader_can(checks)
    wider = [(p, oct(bits)) for p, bits in cases.items()
             if (bits & 4 and not got[("r", p)]) or (bits & 1 and not got[("x", p)])]
    assert not wider, f"shown bits wider than the kernel grants: {wider[:5]}"
    assert sum(bool(bits & 4) for bits in cases.values()) > 60, "narrowed closes (nearly) everything"


def test_malformed_and_absent_acls():
    assert access.narrowed(0o755, None, 0) == 0o755
    assert access.narrowed(0o755, access.UNREADABLE, 0) == 0o700  # only the owner, as the kernel
    assert access.narrowed(0o705, b"\x02\0\0\0garbage!", 0) == 0o705  # no group bits: the kernel skips the ACL
    deny = acl_blob([(access.ACL_USER_OBJ, 7, 0), (access.ACL_USER, 0, 999), (access.ACL_GROUP_OBJ, 5, 0),
                     (access.ACL_MASK, 5, 0), (access.ACL_OTHER, 5, 0)])
    assert access.narrowed(0o755, deny, 0) == 0o700
    assert access.narrowed(0o755, deny, 999) == 0o755  # an entry naming the owner is never used
    group_deny = acl_blob([(access.ACL_USER_OBJ, 7, 0), (access.ACL_GROUP_OBJ, 5, 0), (access.ACL_GROUP, 0, 7),
                           (access.ACL_MASK, 5, 0), (access.ACL_OTHER, 5, 0)])
    assert access.narrowed(0o755, group_deny, 0) == 0o750  # a named group: others may be in it
    assert access.narrowed(0o755, deny[:-3], 0) == 0o700  # truncated
    assert access.narrowed(0o755, b"\x01\0\0\0" + deny[4:], 0) == 0o700  # another version


# -- the walk, without a mount ---------------------------------------------------------------


def test_the_walk_finds_every_directory_a_lookup_passes(public_tmp):
    """`a -> d1/l`, `d1/l -> ../d2/f`: d1 is searched, though it is on neither the link's path
    nor the file's; `..` searches the directory it leaves; loops and dangling links reach
    nothing."""
    root = public_tmp / "w"
    for d in ("d1", "d2", "d3/sub"):
        (root / d).mkdir(parents=True)
    (root / "d2/f").write_bytes(b"f")
    (root / "d1/l").symlink_to("../d2/f")
    (root / "a").symlink_to("d1/l")
    (root / "b").symlink_to("d3/sub/../../d2/f")
    (root / "loop").symlink_to("loop")
    (root / "dangling").symlink_to("nowhere")
    real = str(root)
    w = resolve(real, ["a"])
    assert w.real == f"{real}/d2/f" and set(w.gates) == {real, f"{real}/d1", f"{real}/d2"}
    w = resolve(real, ["b"])
    assert w.real == f"{real}/d2/f" and {f"{real}/d3", f"{real}/d3/sub"} <= set(w.gates)
    assert resolve(real, ["loop"]).real is None and resolve(real, ["dangling"]).real is None
    w = resolve(real, ["d3", "sub"])
    assert [p[0] for p in w.prefixes] == ["d3", "d3/sub"]


def test_a_link_in_a_sticky_world_writable_directory_is_a_gate_only_its_owner_passes(public_tmp, reader):
    """fs.protected_symlinks: such a link is followed only by its owner (or by anyone when the
    directory's owner owns it): with the sysctl on, a walk adds a gate for it."""
    root = public_tmp / "s"
    (root / "tmpish").mkdir(parents=True)
    (root / "tmpish").chmod(0o1777)
    (root / "data").mkdir()
    (root / "data/f").write_bytes(b"f")
    (root / "tmpish/l").symlink_to("../data/f")
    os.chown(root / "tmpish/l", reader, reader, follow_symlinks=False)
    w = resolve(str(root), ["tmpish", "l"], protected=True)
    gates = [g for g in w.gates if not isinstance(g, str)]
    assert gates == [(reader, access.NO_GROUP, 0o100)]
    dirs = [access.dir_facts(g) if isinstance(g, str) else g for g in w.gates]
    assert access.reach(dirs, 0, 0) == 0o700  # a root-owned file: its owner, not group nor others
    assert not [g for g in resolve(str(root), ["tmpish", "l"], protected=False).gates if not isinstance(g, str)]


async def test_a_link_retargeted_into_a_closed_directory_is_walked_again(public_tmp):
    """A file whose real path is not its directory's remembered real path plus its name is
    walked afresh: `lnk -> open` then `lnk -> closed` (a 0700 directory) closes `lnk/f`."""
    root = public_tmp / "r"
    for d, mode in (("open", 0o755), ("closed", 0o700)):
        (root / d).mkdir(parents=True)
        (root / d / "f").write_bytes(d.encode())
        (root / d).chmod(mode)
    (root / "lnk").symlink_to("open")
    store = LocalStore(str(root))
    try:
        assert (await store.current("lnk/f")).mode == 0o644
        assert {e.name: e.mode for e in await store.list("lnk")} == {"f": 0o644}
        (root / "lnk").unlink()
        (root / "lnk").symlink_to("closed")
        assert (await store.current("lnk/f")).mode == 0o600
        assert (await store.read("lnk/f")) == b"closed"
        assert {e.name: e.mode for e in await store.list("lnk")} == {"f": 0o600}
        assert {e.name: e.mode for e in await store.list("")}["lnk"] == 0o700
        assert (await store.info("lnk")).mode == 0o700
    finally:
        await store.aclose()


async def test_refresh_reads_directory_acls_again(public_tmp, reader):
    root = public_tmp / "a"
    (root / "d").mkdir(parents=True)
    (root / "d/f").write_bytes(b"f")
    store = LocalStore(str(root))
    try:
        assert (await store.current("d/f")).mode == 0o644
        set_acl(root / "d", f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x")
        store.forget_directories()
        assert (await store.current("d/f")).mode == 0o600
        set_acl(root / "d/f", f"u::rw-,g::r--,g:{FOREIGN_GID}:---,m::r--,o::r--")
        set_acl(root / "d", "u::rwx,g::r-x,o::r-x")
        store.forget_directories()
        assert (await store.current("d/f")).mode == 0o640  # a named group: others may be in it
    finally:
        await store.aclose()


# -- through real mounts: crafted layouts -------------------------------------------------------


@pytest.fixture(scope="module")
def template():
    """One small sharded array written by zarr-python (16x16, shards 8x8, chunks 4x4: 2x2 shards
    of 2x2 chunks, 16 chunk files), copied wherever a layout wants an array."""
    path = Path(tempfile.mkdtemp(prefix="zvfs-tmpl-"))
    a = zarr.create_array(str(path / "arr"), shape=(16, 16), shards=(8, 8), chunks=(4, 4), dtype="uint8",
                          fill_value=0, compressors=None)
    a[...] = (np.arange(256).reshape(16, 16) % 251 + 1).astype("uint8")
    yield path / "arr"
    shutil.rmtree(path, ignore_errors=True)


def _put_array(template: Path, where: Path) -> None:
    shutil.copytree(template, where, symlinks=True)
    for p in [where, *where.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def _group(where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    (where / "zarr.json").chmod(0o644)


def _arrays(store: Path) -> set[str]:
    """Store paths (lexical, links followed) of every array: what the views may show."""
    found = set()
    for dirpath, _, files in os.walk(store, followlinks=True):
        if "zarr.json" in files and '"array"' in (Path(dirpath) / "zarr.json").read_text():
            rel = os.path.relpath(dirpath, store)
            if rel.count("/") < 12:
                found.add("" if rel == "." else rel)
    return found


def _store_path(view: str, rel: str, arrays: set[str]) -> str | None:
    """The store file whose bytes a mount file `rel` of `view` comes from (None: not known)."""
    parent, _, name = rel.rpartition("/")
    if name in META:
        return f"{parent}/zarr.json" if parent else "zarr.json"
    owner = max((a for a in arrays if rel.startswith(a + "/")), key=len, default=None)
    if owner is None:
        return rel if view == "zarr" else None  # a pass-through file, as stored
    rest = rel[len(owner) + 1:].split("/")
    if view == "zarr":
        assert rest[0] == "c", rel
        i, j = int(rest[1]), int(rest[2])
    elif view == "zarr2":
        i, j = int(rest[0]), int(rest[1])
    else:  # n5: dimensions fastest-varying first
        j, i = int(rest[0]), int(rest[1])
    return f"{owner}/c/{i // 2}/{j // 2}"


def _compare(store: Path, mnt: Path, view: str, exact_unless: tuple[str, ...] = ()) -> dict:
    """Every file (and pass-through directory) of the mount, read by the reader through the mount
    and, by the same path, in the store: never more through the mount. Where the store path
    leads through none of `exact_unless` (layouts that mode bits cannot express: a named-user
    ACL for someone else, a directory open to a group the file is not in), exactly as much."""
    arrays = _arrays(store)
    files, dirs = [], []
    for dirpath, dirnames, filenames in os.walk(mnt):
        rel_dir = os.path.relpath(dirpath, mnt)
        for f in filenames:
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            src = _store_path(view, rel, arrays)
            if src is not None:
                files.append((rel, src))
        if view == "zarr" and rel_dir != "." and not any(rel_dir == a or rel_dir.startswith(a + "/") for a in arrays):
            dirs.append(rel_dir)
    assert files, f"{view}: the mount shows no files"
    asked = [("read", mnt / rel) for rel, _ in files] + [("read", store / src) for _, src in files]
    asked += [("list", mnt / d) for d in dirs] + [("list", store / d) for d in dirs]
    got = reader_can(asked)
    wider, narrower, readable = [], [], 0
    for rel, src in files:
        through, direct = got[("read", str(mnt / rel))], got[("read", str(store / src))]
        readable += through
        if through and not direct:
            wider.append(rel)
        elif direct and not through and not any(m in os.path.realpath(store / src) or m in src for m in exact_unless):
            narrower.append(rel)
    for d in dirs:
        if got[("list", str(mnt / d))] and not got[("list", str(store / d))]:
            wider.append(d + "/")
    if view == "n5" and narrower:  # (its chunk directories span every shard row: one closed closes them all)
        rows = {rel: [f"{c}/{r.name}" for r in os.scandir(store / c) if r.is_dir()]
                for rel, src in files if (c := src.rsplit("/", 2)[0]) and (store / c).is_dir()}
        can = reader_can([("list", store / r) for r in sorted({r for rs in rows.values() for r in rs})])
        narrower = [rel for rel in narrower if all(can[("list", str(store / r))] and not any(
            m in os.path.realpath(store / r) for m in exact_unless) for r in rows.get(rel, ()))]
    assert not wider, f"{view}: the reader reads through the mount what the store refuses: {sorted(wider)[:8]} ({len(wider)})"
    assert not narrower, f"{view}: closed through the mount, open in the store: {sorted(narrower)[:8]} ({len(narrower)})"
    return {"files": len(files), "readable": readable}


@pytest.fixture(scope="module")
def attacked_store(template, reader):
    """The attacker's layouts and more: symlinked arrays, `c/`, shards, row directories and
    pass-through files and directories into a 0700 directory; a link to a link through a 0700
    directory; `..` through a 0700 directory; targets closed to the reader's group only; ACL
    denies on a row directory, a shard, an array (by named group), a pass-through file; and
    the cases mode bits cannot express, shown narrower: an ACL that denies another user, a
    directory open to a group the files are not in, an ACL that grants the reader more."""
    uid, gid = reader_ids()
    base = Path(tempfile.mkdtemp(prefix="zvfs-attacked-"))
    base.chmod(0o755)
    s = base / "store.zarr"
    _group(s)
    _put_array(template, s / "a")
    _group(s / "private")
    _put_array(template, s / "private/arr")
    (s / "private/notes.txt").write_text("TOP SECRET\n")
    (s / "private/sub").mkdir()
    (s / "private/sub/x.txt").write_text("secret too\n")
    (s / "private").chmod(0o700)
    (s / "linkarr").symlink_to("private/arr")  # a whole array
    _put_array(template, s / "b")
    shutil.rmtree(s / "b/c")
    (s / "b/c").symlink_to("../private/arr/c")  # its c/
    (s / "a/c/1/1").unlink()
    (s / "a/c/1/1").symlink_to("../../../private/arr/c/1/1")  # one shard
    _put_array(template, s / "rowlink")
    shutil.rmtree(s / "rowlink/c/0")
    (s / "rowlink/c/0").symlink_to("../../private/arr/c/0")  # one row directory
    (s / "misc").mkdir()
    (s / "misc/notes_link").symlink_to("../private/notes.txt")  # pass-through file
    (s / "misc/dirlink").symlink_to("../private/sub")  # pass-through directory
    (s / "misc/open.txt").write_text("open\n")
    (s / "misc/open_link").symlink_to("open.txt")
    # a link to a link, through a 0700 directory that is on neither path
    (s / "hop").mkdir()
    (s / "hop/l").symlink_to("../a")
    (s / "hop").chmod(0o700)
    (s / "chain").symlink_to("hop/l")
    # `..` through a 0700 directory
    (s / "dotdot").symlink_to("hop/../a")
    # absolute links, to open and closed places
    (s / "abs_open").symlink_to(str(s / "a"))
    (s / "abs_closed").symlink_to(str(s / "private/arr"))
    # closed to the reader's group only (0705 root:reader): the reader, a member, is stopped
    _group(s / "grp")
    _put_array(template, s / "grp/arr")
    os.chown(s / "grp", 0, gid)
    (s / "grp").chmod(0o705)
    (s / "grplink").symlink_to("grp/arr")
    # owned by the reader, 0055: the reader, its owner, is stopped
    _put_array(template, s / "own")
    os.chown(s / "own/c", uid, 0)
    (s / "own/c").chmod(0o055)
    # ACLs that deny the reader: a row directory, a shard, an array (the reader's group), a file
    _put_array(template, s / "acl_row")
    set_acl(s / "acl_row/c/1", f"u::rwx,u:{uid}:---,g::r-x,m::r-x,o::r-x")
    _put_array(template, s / "acl_shard")
    set_acl(s / "acl_shard/c/0/1", f"u::rw-,u:{uid}:---,g::r--,m::r--,o::r--")
    _put_array(template, s / "acl_group")
    set_acl(s / "acl_group", f"u::rwx,g::r-x,g:{gid}:---,m::r-x,o::r-x")
    set_acl(s / "misc/open.txt", f"u::rw-,u:{uid}:---,g::r--,m::r--,o::r--")
    (s / "acl_linked").symlink_to("acl_row")
    # what mode bits cannot express (narrower: the reader passes in the store, not in the mount)
    _put_array(template, s / "narrow_foreign")
    set_acl(s / "narrow_foreign/c", f"u::rwx,u:{FOREIGN_UID}:---,g::r-x,m::r-x,o::r-x")
    _group(s / "narrow_group")
    _put_array(template, s / "narrow_group/arr")
    os.chown(s / "narrow_group", 0, gid)
    (s / "narrow_group").chmod(0o750)
    _put_array(template, s / "narrow_grant")
    (s / "narrow_grant/c/0/0").chmod(0o600)
    set_acl(s / "narrow_grant/c/0/0", f"u::rw-,u:{uid}:r--,g::---,m::r--,o::---")
    yield s
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_links_and_acls_never_open_more_than_the_store(attacked_store, reader, view):
    """The attacker's layouts and more (see `attacked_store`), in every view: every file the
    reader reads through an allow_other mount it also reads in the store by the same path;
    everything the store lets it read is readable through the mount too, except where mode
    bits cannot say it (those are shown narrower, on purpose). Before: 257 files of the 0700
    array and the secret notes through links, 64 chunk files under the ACL-denied row."""
    s = attacked_store
    mnt = s.parent / f"mnt-{view}"
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    with zvfs_mount(s, mnt, options=["allow_other", f"view={view}"]):
        got = _compare(s, mnt, view, exact_unless=("narrow_",))
        closed = [mnt / "linkarr" / p for p in ("zarr.json", ".zarray", "attributes.json")]
        assert any(p.exists() for p in closed), "root sees the linked array"
        can = reader_can([("read", p) for p in closed if p.exists()])
        assert not any(can.values()), "the reader reads a 0700 array's metadata through a link"
        if view == "zarr":
            probe = reader_can([("read", mnt / "misc/notes_link"), ("read", mnt / "misc/dirlink/x.txt"),
                                ("list", mnt / "misc/dirlink"), ("read", mnt / "misc/open_link"),
                                ("read", mnt / "a/c/0/0"), ("read", mnt / "a/c/2/2"), ("read", mnt / "chain/c/0/0"),
                                ("read", mnt / "abs_open/c/0/0"), ("read", mnt / "acl_row/c/0/0"),
                                ("read", mnt / "acl_row/c/2/2"), ("read", mnt / "acl_linked/c/2/2")])
            assert not probe[("read", str(mnt / "misc/notes_link"))], "the secret notes through a link"
            assert not probe[("read", str(mnt / "misc/dirlink/x.txt"))] and not probe[("list", str(mnt / "misc/dirlink"))]
            assert not probe[("read", str(mnt / "misc/open_link"))], "a pass-through file whose ACL denies the reader"
            assert not probe[("read", str(mnt / "a/c/2/2"))], "a chunk of the shard linked into private/"
            assert not probe[("read", str(mnt / "chain/c/0/0"))], "a link to a link through a 0700 directory"
            assert not probe[("read", str(mnt / "acl_row/c/2/2"))] and not probe[("read", str(mnt / "acl_linked/c/2/2"))]
            assert probe[("read", str(mnt / "a/c/0/0"))] and probe[("read", str(mnt / "abs_open/c/0/0"))]
            assert probe[("read", str(mnt / "acl_row/c/0/0"))], "the rows the ACL does not deny stay readable"
        assert got["readable"] >= (40 if view == "n5" else 60), f"{view}: the reader reads almost nothing: {got}"


# -- through real mounts: random layouts --------------------------------------------------------

#: pool directories: (mode, owner, group, ACL spec or None, narrower on purpose)
POOL = {
    "open": (0o755, 0, 0, None, False),
    "closed": (0o700, 0, 0, None, False),
    "x711": (0o711, 0, 0, None, False),
    "grp705": (0o705, 0, "reader", None, False),
    "own055": (0o055, "reader", 0, None, False),
    "aclr": (0o755, 0, 0, "u::rwx,u:{uid}:---,g::r-x,m::r-x,o::r-x", False),
    "aclg": (0o755, 0, 0, "u::rwx,g::r-x,g:{gid}:--x,m::r-x,o::r-x", False),
    "narrow_aclf": (0o755, 0, 0, "u::rwx,u:{foreign}:---,g::r-x,m::r-x,o::r-x", True),
    "narrow_g750": (0o750, 0, "reader", None, True),
}
HOP_MODES = [0o755, 0o700, 0o711, 0o701, 0o750, 0o705]




def random_layout(template: Path, root: Path, seed: int) -> None:
    """A store with a pool of arrays and files in directories of every kind above (each array
    with a random row directory or shard closed by mode or ACL), and random links to them: whole
    arrays, `c/`, row directories, shards, pass-through files and directories, relative and
    absolute, chains of links through `hops/` directories of random modes, `..` through them,
    links to links."""
    uid, gid = reader_ids()
    rnd = random.Random(seed)
    _group(root)
    _group(root / "pool")
    (root / "pool").chmod(0o755)
    for name, (mode, owner, group, acl, _) in POOL.items():
        d = root / "pool" / name
        _group(d)
        _put_array(template, d / "arr")
        (d / "t.txt").write_text(name)
        (d / "sub").mkdir()
        (d / "sub/t.txt").write_text(name + "/sub")
        for p in (d / "t.txt", d / "sub/t.txt"):
            p.chmod(0o644)
        (d / "sub").chmod(0o755)
        # something closed inside each array
        what = rnd.choice(["row700", "rowacl", "shard600", "shardacl", "shardgrp", "nothing"])
        row, shard = d / f"arr/c/{rnd.randrange(2)}", d / f"arr/c/{rnd.randrange(2)}/{rnd.randrange(2)}"
        if what == "row700":
            row.chmod(0o700)
        elif what == "rowacl":
            set_acl(row, f"u::rwx,u:{uid}:---,g::r-x,m::r-x,o::r-x")
        elif what == "shard600":
            shard.chmod(0o600)
        elif what == "shardacl":
            set_acl(shard, f"u::rw-,g::r--,g:{gid}:---,m::r--,o::r--")
        elif what == "shardgrp":
            os.chown(shard, 0, gid)
            shard.chmod(0o640)
        os.chown(d, uid if owner == "reader" else owner, gid if group == "reader" else group)
        d.chmod(mode)
        if acl:
            set_acl(d, acl.format(uid=uid, gid=gid, foreign=FOREIGN_UID))
    _group(root / "hops")
    hops = []
    for k in range(4):
        h = root / "hops" / f"h{k}"
        _group(h)
        hops.append(h)
    (root / "misc").mkdir()
    targets = list(POOL)
    links: list[str] = []  # visible links to whole arrays (for links to links)
    for n in range(14):
        pool = rnd.choice(targets)
        kind = rnd.choice(["arr", "arr", "chain", "dotdot", "abs", "c", "row", "shard", "file", "dir", "tolink"])
        v = root / f"v{n}"
        if kind == "arr":
            v.symlink_to(f"pool/{pool}/arr")
            links.append(v.name)
        elif kind == "abs":
            v.symlink_to(str(root / "pool" / pool / "arr"))
            links.append(v.name)
        elif kind == "chain":
            h = rnd.choice(hops)
            (h / f"l{n}").symlink_to(f"../../pool/{pool}/arr")
            v.symlink_to(f"hops/{h.name}/l{n}")
            links.append(v.name)
        elif kind == "dotdot":
            v.symlink_to(f"hops/{rnd.choice(hops).name}/../../pool/{pool}/arr")
            links.append(v.name)
        elif kind == "tolink" and links:
            v.symlink_to(rnd.choice(links))
        elif kind in ("c", "row", "shard"):
            _put_array(template, v)
            if kind == "c":
                shutil.rmtree(v / "c")
                (v / "c").symlink_to(f"../pool/{pool}/arr/c")
            elif kind == "row":
                r = rnd.randrange(2)
                shutil.rmtree(v / f"c/{r}")
                (v / f"c/{r}").symlink_to(f"../../pool/{pool}/arr/c/{r}")
            else:
                r, q = rnd.randrange(2), rnd.randrange(2)
                (v / f"c/{r}/{q}").unlink()
                (v / f"c/{r}/{q}").symlink_to(f"../../../pool/{pool}/arr/c/{r}/{q}")
        elif kind == "file":
            (root / "misc" / f"f{n}").symlink_to(f"../pool/{pool}/{rnd.choice(['t.txt', 'sub/t.txt'])}")
        else:
            (root / "misc" / f"d{n}").symlink_to(f"../pool/{pool}/sub")
    for h in hops:  # the hops closed last (the links above were made through them)
        h.chmod(rnd.choice(HOP_MODES))
        if rnd.random() < 0.3:
            os.chown(h, 0, gid)


@pytest.fixture(scope="module", params=[1, 2, 3])
def random_store(template, reader, request):
    base = Path(tempfile.mkdtemp(prefix=f"zvfs-random{request.param}-"))
    base.chmod(0o755)
    random_layout(template, base / "store.zarr", request.param)
    yield base / "store.zarr"
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_random_link_layouts_never_open_more_than_the_store(random_store, reader, view):
    """Random links (whole arrays, `c/`, row directories, shards, pass-through files and
    directories; relative, absolute, chains through hop directories of random modes, `..`,
    links to links) into a pool of directories closed in every way (mode, owner, group, ACLs):
    for every file of the mount, the reader reads it through the mount only if it reads it in
    the store, and (outside the layouts mode bits cannot express) exactly then."""
    mnt = random_store.parent / f"mnt-{view}"
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    with zvfs_mount(random_store, mnt, options=["allow_other", f"view={view}"]):
        got = _compare(random_store, mnt, view, exact_unless=("narrow_",))
    assert got["readable"] > 0, got


def test_refresh_sees_a_link_retargeted_and_an_acl_added(attacked_store, reader):
    """After `zvfs refresh`, a link that now leads into 0700 `private/` and a new ACL that denies
    the reader on a row directory close what they lead to (directory facts are read again)."""
    s = attacked_store.parent / "refresh.zarr"
    shutil.copytree(attacked_store / "a", s / "a", symlinks=True)
    shutil.copytree(attacked_store / "private", s / "private", symlinks=True)
    _group(s)
    (s / "a/c/1/1").unlink()
    shutil.copy(attacked_store / "private/arr/c/1/1", s / "a/c/1/1")
    (s / "a/c/1/1").chmod(0o644)
    (s / "mirror").symlink_to("a")
    mnt = attacked_store.parent / "mnt-refresh"
    mnt.mkdir(exist_ok=True)
    mnt.chmod(0o755)
    try:
        with zvfs_mount(s, mnt, options=["allow_other"]):
            probe = [("read", mnt / "mirror/c/0/0"), ("read", mnt / "a/c/2/0")]
            assert all(reader_can(probe).values())
            (s / "mirror").unlink()
            (s / "mirror").symlink_to("private/arr")
            set_acl(s / "a/c/1", f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x")
            assert run_zvfs("refresh", mnt).returncode == 0
            can = reader_can(probe)
            assert not can[("read", str(mnt / "mirror/c/0/0"))] and not can[("read", str(mnt / "a/c/2/0"))], can
    finally:
        shutil.rmtree(s, ignore_errors=True)


# -- directories whose permissions change while mounted ------------------------------------------


def _settle(check, deadline: float):
    """`check()` until it passes or `deadline` (seconds) is over; the last failure is raised."""
    end = time.monotonic() + deadline
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.3)


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_directories_narrowed_or_widened_while_mounted_follow_the_store(public_tmp, template, reader, view):
    """Random rounds: directories at every level (the store root, a group, an array, its `c/`,
    a shard's row directory that no view shows, a pass-through directory) are narrowed to 0700,
    given an ACL that denies the reader, or opened again, while mounted with allow_other; within
    a few seconds the reader reads through the mount exactly what the store lets them, without
    `zvfs refresh` (an outside attacker: a store root or `c/` narrowed stayed readable until
    then; a directory opened again stayed closed for the kernel's 24 h)."""
    s = public_tmp / "live.zarr"
    _group(s)
    _group(s / "g")
    _put_array(template, s / "g/a")
    _put_array(template, s / "b")
    (s / "misc").mkdir()
    (s / "misc/notes.txt").write_text("notes\n")
    for p in [s, *s.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    levels = [s, s / "g", s / "g/a", s / "g/a/c", s / "g/a/c/1", s / "b/c", s / "misc"]
    mnt = public_tmp / "mnt"
    mnt.mkdir()
    mnt.chmod(0o755)
    rng = random.Random(f"{view}-{time.time_ns()}")
    daemon_log = public_tmp / "zvfs.log"
    with zvfs_mount(s, mnt, options=["allow_other", f"view={view}"], log=daemon_log):
        assert _compare(s, mnt, view)["readable"] > 0
        state = {d: "open" for d in levels}
        for n in range(5):
            for d in rng.sample(levels, rng.randint(1, 3)):
                how = state[d] = rng.choice(["0700", "deny", "open", "open"])
                if how == "deny":
                    set_acl(d, f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x")
                else:
                    set_acl(d, "u::rwx,g::r-x,o::r-x")
                    d.chmod(0o700 if how == "0700" else 0o755)
            started = time.monotonic()
            try:
                got = _settle(lambda: _compare(s, mnt, view), 6.0)
            except AssertionError as e:  # (what was changed, and when the daemon saw it)
                changed = " ".join(f"{d.relative_to(s)}={how}" for d, how in state.items())
                raise AssertionError(f"round {n} ({changed}): {e}\n{daemon_log.read_text()[-3000:]}") from None
            log = [f"{d.relative_to(public_tmp)}={oct(d.stat().st_mode & 0o777)}" for d in levels]
            print(f"{view}: matched the store after {time.monotonic() - started:.1f} s ({got}; {' '.join(log)})")


def _closed_below(mnt: Path, below: str) -> int:
    """The reader can list neither the mount's directory `below` nor any directory under it,
    nor read any file under it (all walked as root, who passes every bit). How many files
    root found (a store moved away may show none to root either: its path names nothing)."""
    files, dirs = [], []
    for d, _, fs in os.walk(mnt / below):
        dirs.append(Path(d))
        files += [Path(d) / f for f in fs]
    got = reader_can([("read", f) for f in files] + [("list", d) for d in dirs])
    opened = sorted(f"{how} {p}" for (how, p), ok in got.items() if ok)
    assert not opened, f"the reader reads through the mount what the store no longer shows them: {opened[:6]} ({len(opened)})"
    return len(files)


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_a_store_moved_while_mounted_is_followed(public_tmp, template, reader, view):
    """Random rounds of moves while mounted with allow_other: the store root moved into a
    directory the reader cannot search (0700), the same with an empty 0755 directory made in
    its place, its parent moved there, an array moved there or deleted (after its chunks were
    read), an array deleted and made again with its `c/` closed, a copy of it with `c/` closed
    bind-mounted over it; `zvfs refresh` on the way; then moved back. Within a few seconds the reader reads through the mount none of what moved
    (its path names nothing the reader may read now), and once back, exactly what it did
    before. Before: a moved store stayed readable whole through the mount (its descriptors
    still reach it), an array moved away kept its metadata readable, and `zvfs refresh` failed
    with EIO (an outside attacker, every view and `zvfs serve`)."""
    top = public_tmp / "top"
    pub, priv = top / "pub", public_tmp / "priv"
    for d, mode in ((top, 0o755), (pub, 0o755), (priv, 0o700)):
        d.mkdir()
        d.chmod(mode)
    s = pub / "s.zarr"
    _group(s)
    _put_array(template, s / "a")
    _group(s / "g")
    _put_array(template, s / "g/b")
    for p in [s, *s.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    mnt = public_tmp / "mnt"
    mnt.mkdir()
    mnt.chmod(0o755)
    moves = {  # what moves away (and what the reader must lose): done, undone
        "root": ("", lambda: s.rename(priv / "s"), lambda: (priv / "s").rename(s)),
        "root, a directory in its place": ("", lambda: (s.rename(priv / "s"), s.mkdir(mode=0o755)),
                                           lambda: (s.rmdir(), (priv / "s").rename(s))),
        "parent": ("", lambda: pub.rename(priv / "pub"), lambda: (priv / "pub").rename(pub)),
        "array": ("a", lambda: (s / "a").rename(priv / "a"), lambda: (priv / "a").rename(s / "a")),
        "nested array": ("g/b", lambda: (s / "g/b").rename(priv / "b"), lambda: (priv / "b").rename(s / "g/b")),
        # (its chunks were read: the store's descriptors pin its directories, whose own
        # IN_DELETE_SELF then never comes; an outside attacker's `rm -rf` went unseen)
        "array deleted": ("a", lambda: shutil.rmtree(s / "a"), lambda: _put_array(template, s / "a")),
        "array made again with c/ closed": (None, lambda: (shutil.rmtree(s / "a"), _put_array(template, s / "a"),
                                                            (s / "a/c").chmod(0o700)),
                                            lambda: (s / "a/c").chmod(0o755)),
        # (a mount sends no inotify event: a change of the mount table is a look at everything)
        "a copy with c/ closed bind-mounted over an array": (None, lambda: _bind_closed_copy(template, priv / "bound", s / "a"),
                                                              lambda: subprocess.run(["umount", "--lazy", str(s / "a")], check=True)),
    }
    rng = random.Random(f"{view}-{time.time_ns()}")
    bind = "a copy with c/ closed bind-mounted over an array"  # (first: everything below it just read)
    order = [bind, *rng.sample(sorted(set(moves) - {bind}), len(moves) - 1)]
    log = public_tmp / "zvfs.log"
    try:
        with zvfs_mount(s, mnt, log=log, options=["allow_other", f"view={view}"]):
            before = _compare(s, mnt, view)
            assert before["readable"] == before["files"]
            for name in order:
                below, away, back = moves[name]
                away()
                started = time.monotonic()
                if below is not None:
                    _settle(lambda: _closed_below(mnt, below), 6.0)
                if below != "":  # (the rest of the store stays as it is)
                    _settle(lambda: _compare(s, mnt, view), 6.0)
                if rng.random() < 0.5:
                    assert run_zvfs("refresh", mnt).returncode == 0
                    if below is not None:
                        _closed_below(mnt, below)
                print(f"{view}: {name} moved away: closed after {time.monotonic() - started:.1f} s")
                back()
                try:
                    _settle(lambda: _compare(s, mnt, view) == before or _fail(f"{name} moved back: {_compare(s, mnt, view)}"), 6.0)
                except AssertionError as e:  # (seen once in CI, under load, not since: the daemon's words with it)
                    raise AssertionError(f"{name} moved back, after {order[:order.index(name)]}: {e}\n"
                                         f"zvfs log:\n{log.read_text(errors='replace')[-3000:]}") from None
    finally:
        for where in (s / "a", priv / "s/a", priv / "pub/s.zarr/a"):
            while os.path.ismount(where):
                subprocess.run(["umount", "--lazy", str(where)], check=True)


@pytest.mark.parametrize("view", ["zarr", "zarr2"])
def test_an_archive_moved_or_narrowed_while_mounted_is_followed(public_tmp, reader, view):
    """A zip archive (zarr-python's ZipStore) mounted with allow_other, then in random order:
    moved into a directory the reader cannot search, its directory closed (0700, or an ACL
    that denies the reader), narrowed itself (0600), deleted; each undone. Within a few seconds
    the reader reads nothing through the mount, and afterwards everything again. Before, all of
    it stayed readable (an outside attacker, the mount and `zvfs serve`: only local stores were
    watched)."""
    from zarr.storage import ZipStore

    top, priv = public_tmp / "d", public_tmp / "priv"
    top.mkdir(mode=0o755)
    priv.mkdir(mode=0o700)
    top.chmod(0o755)
    priv.chmod(0o700)
    archive = top / "s.zip"
    zs = ZipStore(archive, mode="w")
    a = zarr.create_array(zs, name="a", shape=(16, 16), chunks=(4, 4), shards=(8, 8), dtype="uint8")
    a[...] = np.arange(256, dtype="uint8").reshape(16, 16)
    zs.close()
    archive.chmod(0o644)
    mnt = public_tmp / "mnt"
    mnt.mkdir(mode=0o755)
    mnt.chmod(0o755)
    changes = {
        "moved": (lambda: archive.rename(priv / "s.zip"), lambda: (priv / "s.zip").rename(archive)),
        "directory closed": (lambda: top.chmod(0o700), lambda: top.chmod(0o755)),
        "directory denies the reader": (lambda: set_acl(top, f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x"),
                                        lambda: set_acl(top, "u::rwx,g::r-x,o::r-x")),
        "archive narrowed": (lambda: archive.chmod(0o600), lambda: archive.chmod(0o644)),
        "deleted": (lambda: shutil.copy(archive, priv / "keep.zip") and archive.unlink(),
                    lambda: shutil.copy(priv / "keep.zip", archive) and archive.chmod(0o644)),
        # (a link leading outside the store is not followed: the archive's path opens nothing)
        "replaced by a link into the closed directory": (lambda: _replace(archive, lambda new: (
            shutil.copy(archive, priv / "linked.zip"), new.symlink_to(priv / "linked.zip"))),
            lambda: _replace(archive, lambda new: (shutil.copy(priv / "linked.zip", new), new.chmod(0o644)))),
    }

    def all_readable():
        files = [Path(d) / f for d, _, fs in os.walk(mnt) for f in fs]
        assert len(files) > 16 and all(reader_can([("read", f) for f in files]).values())

    rng = random.Random(f"{view}-{time.time_ns()}")
    with zvfs_mount(archive, mnt, options=["allow_other", f"view={view}"]):
        all_readable()
        for name in rng.sample(sorted(changes), len(changes)):
            away, back = changes[name]
            print(f"{view}: archive {name}")
            away()
            _settle(lambda: _closed_below(mnt, ""), 6.0)
            back()
            _settle(all_readable, 6.0)


def _bind_closed_copy(template: Path, copy: Path, over: Path) -> None:
    if copy.exists():
        shutil.rmtree(copy)
    _put_array(template, copy)
    (copy / "c").chmod(0o700)
    subprocess.run(["mount", "--bind", str(copy), str(over)], check=True)


def _replace(path: Path, make) -> None:
    """`path` renamed over by what `make(new)` makes at a name beside it."""
    new = path.with_name(path.name + ".new")
    make(new)
    os.replace(new, path)


def _fail(message: str):
    raise AssertionError(message)


def _unwatched(store: LocalStore, every: bool) -> None:
    """Every directory looked at by a stat at each look (as on a network filesystem), or none."""
    if every:
        store._mounts.stalling_points = lambda: frozenset({"/"})


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_directories_changed_sees_bits_owners_and_acls_not_a_directory_gone(public_tmp, reader, looked_at):
    """FUSE-free: what the watch of a mount asks every second (`LocalStore.directories_changed`),
    told by inotify which directories to look at, or looking at each (filesystems inotify
    may not follow: network, FUSE)."""
    root = public_tmp / "s"
    (root / "d/e").mkdir(parents=True)
    (root / "d/e/f").write_bytes(b"f")
    store = LocalStore(str(root))
    _unwatched(store, looked_at == "stat each")
    try:
        assert (await store.current("d/e/f")).mode == 0o644
        assert not await store.directories_changed()
        (root / "d").chmod(0o700)
        assert await store.directories_changed()
        store.forget_directories()
        assert (await store.current("d/e/f")).mode == 0o600 and not await store.directories_changed()
        (root / "d").chmod(0o755)
        store.forget_directories()
        assert (await store.current("d/e/f")).mode == 0o644
        set_acl(root / "d", f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x")
        assert await store.directories_changed()
        store.forget_directories()
        await store.current("d/e/f")
        os.chown(root / "d/e", reader, -1)
        assert await store.directories_changed()
        store.forget_directories()
        await store.current("d/e/f")
        shutil.rmtree(root / "d/e")
        assert not await store.directories_changed(), "a directory gone is no change"
        (root / "d/e").mkdir(mode=0o711)
        assert await store.directories_changed(), "one made again with other bits is"
        public_tmp.chmod(0o700)  # above the store root
        store.forget_directories()
        assert not await store.directories_changed()
        public_tmp.chmod(0o755)
        assert await store.directories_changed()
    finally:
        await store.aclose()


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_a_shown_directory_removed_under_an_open_shard_is_a_change(public_tmp, looked_at):
    """FUSE-free: an array directory a view shows (`info`), removed (`rm -rf`) after a shard
    below it was opened: the store's descriptor pins the removed directories, whose own
    IN_DELETE_SELF then never comes; their parent's IN_DELETE says it (an outside attacker:
    the deleted array stayed readable through the mount). Made again, it is a change again."""
    root = public_tmp / "s"
    for f in (root / "a/c/0/0", root / "a/c/1/1"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"shard")
    store = LocalStore(str(root))
    _unwatched(store, looked_at == "stat each")
    try:
        for key in ("", "a", "a/c"):
            assert (await store.info(key)).is_dir
        assert await store.current("a/c/0/0") is not None
        assert not await store.directories_changed()
        shutil.rmtree(root / "a")
        assert await store.directories_changed(), "a shown directory removed"
        store.forget_directories()
        for key in ("", "a", "a/c"):
            await store.info(key)
        assert not await store.directories_changed(), "gone, and known gone"
        (root / "a/c").mkdir(parents=True)
        assert await store.directories_changed(), "made again"
    finally:
        await store.aclose()


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_a_shown_directory_learned_otherwise_by_a_later_walk_is_a_change(public_tmp, looked_at):
    """FUSE-free: what a view shows of a directory is what `info` found when the views read
    it (a refresh); a lookup's walk after that may learn other facts of it. A look compares the
    directory with what the view shows, not with what the walk learned: an array made again
    while a refresh found it gone, walked by the lookups that followed, stayed shown closed
    (CI, twice: `test_a_store_moved_while_mounted_is_followed`), and one narrowed to 0700
    between the refresh and a walk stayed shown open. Every order of info, change, walk and
    look: a look after both says changed; once the views read it again, no change."""
    root = public_tmp / "s"
    (root / "g").mkdir(parents=True)
    store = LocalStore(str(root))
    _unwatched(store, looked_at == "stat each")

    def make_again() -> None:
        (root / "g/a/c").mkdir(parents=True, mode=0o755)

    def narrow() -> None:
        (root / "g/a").chmod(0o700)

    try:
        for change, first in ((make_again, "gone"), (narrow, "open")):
            if first == "gone":
                shutil.rmtree(root / "g/a", ignore_errors=True)
            else:
                (root / "g/a/c").mkdir(parents=True, exist_ok=True)
                (root / "g/a").chmod(0o755)
            store.forget_directories()
            for key in ("", "g", "g/a"):
                await store.info(key)  # what the views show (`OpenSource.refresh_directories`)
            assert not await store.directories_changed(), first
            change()
            await store.info("g/a/c")  # a lookup's walk from the root: learns g/a as it is now
            assert await store.directories_changed(), f"{change.__name__}: the view shows g/a {first}"
            assert await store.directories_changed(), f"{change.__name__}: until the views read it again"
            store.forget_directories()
            for key in ("", "g", "g/a", "g/a/c"):
                await store.info(key)
            assert not await store.directories_changed(), f"{change.__name__}, then read again"
    finally:
        await store.aclose()


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_shown_directories_below_a_followed_symlink_are_no_change_until_they_change(public_tmp, looked_at):
    """FUSE-free: with follow_symlinks, an array that is a symlink to a directory elsewhere:
    the views show its directories (`info` of `b`, `b/c`), and a look compares each as what it
    is, the target's directories. Before, `b/c` was compared by the path through the link with
    what a missing directory shows, found changed at every look: an idle mount read every
    directory again every second, for good. Its target narrowed is a change."""
    root = public_tmp / "s"
    (root / "a/c").mkdir(parents=True)
    (public_tmp / "elsewhere/c/0").mkdir(parents=True)
    (root / "b").symlink_to(public_tmp / "elsewhere")
    store = LocalStore(str(root), follow_symlinks=True)
    _unwatched(store, looked_at == "stat each")
    try:
        for key in ("", "a", "a/c", "b", "b/c"):
            assert (await store.info(key)).is_dir, key
        assert not await store.directories_changed()
        assert not await store.directories_changed()
        (public_tmp / "elsewhere/c").chmod(0o700)
        assert await store.directories_changed()
    finally:
        await store.aclose()


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_forgetting_walked_directories_is_no_change(public_tmp, looked_at, monkeypatch):
    """FUSE-free: past `DIRS_KEPT` directories walked, the store forgets its walks and facts
    (walked again as used). The directories the views show stay known: forgotten, they were
    compared as gone and back, a change, and every cache was dropped each time a walk passed
    the limit (the fourth outside attacker: "directory permissions changed" after every
    listing of a 3-D array of 90,000 row directories, none chmod'ed). Random rounds; a real
    change is still one."""
    import zvfs.storage.local as local

    monkeypatch.setattr(local, "DIRS_KEPT", 32)
    root = public_tmp / "s"
    rows = [f"a/c/{i}/{j}" for i in range(12) for j in range(12)]
    for row in rows:
        (root / row).mkdir(parents=True)
        (root / row / "0").write_bytes(b"shard")
    (root / "b/c").mkdir(parents=True)  # another array, off the walks
    store = LocalStore(str(root))
    _unwatched(store, looked_at == "stat each")
    rng = random.Random(11)
    try:
        for key in ("", "a", "a/c", "b", "b/c"):
            assert (await store.info(key)).is_dir
        assert not await store.directories_changed()
        for _ in range(4):
            for row in rng.sample(rows, 60):
                assert await store.current(f"{row}/0") is not None
            assert not await store.directories_changed(), "only walks forgotten"
        (root / "b").chmod(0o700)
        assert await store.directories_changed(), "a shown directory closed"
    finally:
        (root / "b").chmod(0o755)
        await store.aclose()


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_an_idle_look_stats_only_what_inotify_cannot_watch(public_tmp, looked_at, monkeypatch):
    """FUSE-free: with inotify, a look at an idle store's 200 directories stats none of them (a
    stat of each every second cost an idle mount 3-6% of a core for 2,421), and a change, a
    directory replaced by another (rename over it) or made inside one costs a stat of the
    directories named; without it (`stat each`), every directory each time. Random rounds."""
    root = public_tmp / "s"
    rng = random.Random(7)
    dirs = [f"a{i}/b{j}" for i in range(20) for j in range(9)]
    for d in dirs:
        (root / d).mkdir(parents=True)
        (root / d / "x").write_bytes(b"x")
    store = LocalStore(str(root))
    _unwatched(store, looked_at == "stat each")
    stats: list[str] = []
    lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: (stats.append(str(p)), lstat(p, *a, **k))[1])
    try:
        for d in dirs:
            await store.current(f"{d}/x")
        assert not await store.directories_changed()  # (the first look compares them all)
        remembered = len({*store._above_paths, *store._facts})
        assert remembered > 180
        for _ in range(12):
            stats.clear()
            assert not await store.directories_changed()
            remembered = len({*store._above_paths, *store._facts})
            # (a look stats the root once more: is it still the directory mounted?)
            assert len(stats) == (remembered + 1 if looked_at == "stat each" else 0), len(stats)
            d = root / rng.choice(dirs)
            how = rng.choice(["chmod", "replaced", "replaced alike", "file made"])
            if how == "chmod":
                d.chmod(0o700)
            elif how in ("replaced", "replaced alike"):
                d.rename(d.with_name(d.name + ".old"))
                d.mkdir(mode=0o711 if how == "replaced" else 0o755)
                d.chmod(0o711 if how == "replaced" else 0o755)
            else:
                (d / "y").write_bytes(b"y")
            stats.clear()
            assert await store.directories_changed() == (how in ("chmod", "replaced")), how
            assert len(stats) <= (remembered + 1 if looked_at == "stat each" else 4), (how, len(stats))
            if how == "replaced alike":  # the new directory is the one followed from here on
                d.chmod(0o700)
                assert await store.directories_changed(), "a change to the directory that replaced another"
                how = "chmod"
            if how in ("chmod", "replaced"):
                store.forget_directories()
                for x in dirs:
                    await store.current(f"{x}/x")
                await store.directories_changed()
    finally:
        await store.aclose()


@pytest.mark.parametrize("case", ["after a change", "a look that waited"])
async def test_the_recheck_counts_only_the_looking(public_tmp, monkeypatch, case):
    """FUSE-free: two things do not count against the check's share of the time. What follows
    a change (reading every shown directory again: 150 ms for an outside attacker's 621):
    counted, it put the next check 3 s later, and a change right after a change was seen
    after 3-5 s. And the time a look waited (for a worker thread, or for the loop busy with a
    listing of thousands of shards: 0.4-0.9 s measured, 0.16-0.28 s of it looking): the check
    counts the processor time of the store's thread that looked (`LocalStore.look_cost`);
    counted, the next check came 9-18 s later, and a row directory narrowed meanwhile stayed
    open to others that long."""
    from zvfs.core import source as source_mod
    from zvfs.core.source import open_source

    root = public_tmp / "s"
    _group(root)
    src = await open_source(str(root))
    checks: list[float] = []

    async def look() -> bool:
        checks.append(trio.current_time())
        if case == "after a change":
            return True
        await trio.sleep(0.3)
        src.store.look_cost = 0.002
        return False

    async def slow_rereading() -> None:
        await trio.sleep(0.25)

    monkeypatch.setattr(src.store, "directories_changed", look)
    monkeypatch.setattr(src, "refresh_directories", slow_rereading)
    try:
        with trio.move_on_after(3 * source_mod.RECHECK + 1):
            await src.watch_permissions(lambda: None)
        gaps = [b - a for a, b in zip(checks, checks[1:])]
        assert len(checks) >= 3 and max(gaps) < source_mod.RECHECK + 0.5, gaps
    finally:
        await src.store.aclose()


# -- listings: no name shown that the store does not list to the reader ---------------------------
#
# The bits of a chunk directory decide who lists it and who looks names up in it. Before, every
# chunk directory took the bits of the array's `c/`: a 0700 row directory (`c/0/`) closed the
# bytes of its shards' chunks, but a non-root reader listed their names, sizes and times (and
# stat'ed them by name) through an allow_other mount, in every view (an outside attacker).

LISTER = r"""
import json, os, sys
out = {}
for kind, path in json.load(sys.stdin):
    try:
        out[kind + ":" + path] = sorted(os.listdir(path)) if kind == "names" else (os.stat(path), True)[1]
    except OSError as e:
        out[kind + ":" + path] = e.errno
print(json.dumps(out))
"""


def reader_sees(items: list[tuple[str, object]]) -> dict[tuple[str, str], object]:
    """For each (kind, path): "names": the names the reader lists in a directory (None if
    refused); "stat": whether the reader can stat a path. One process of the reader's."""
    items = [(k, str(p)) for k, p in items]
    r = subprocess.run(["runuser", "-u", READER, "--", SYSTEM_PYTHON, "-c", LISTER],
                       input=json.dumps(items).encode(), capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    got = json.loads(r.stdout)
    return {(k, p): None if type(got[f"{k}:{p}"]) is int else got[f"{k}:{p}"] for k, p in items}


def _row_dirs(store: Path, array: str, depth: int) -> list[str]:
    """The store's row directories of `array` at `depth` below `c/` (0: `c` itself)."""
    found = [f"{array}/c"]
    for _ in range(depth):
        found = [f"{d}/{e.name}" for d in found if (store / d).is_dir() for e in os.scandir(store / d) if e.is_dir()]
    return found


def _entry_sources(store: Path, view: str, array: str, coords: list[int], ndim: int, per: int) -> list[str]:
    """The store directories whose listings a chunk entry of a view comes from (a reader must be
    able to list every one to see it): a file's, its shard's directory; a directory's (`c/i`
    of the zarr views), the one listing its shard coordinate (`c`), at the same depth; the N5
    view reverses the axes, so its directories' entries come from every row directory at the
    depth of the axis they name."""
    level = len(coords)
    if view == "n5":
        if level == ndim:
            coords = coords[::-1]
        else:
            return _row_dirs(store, array, ndim - level)
    shard = [c // per for c in coords]
    return ["/".join([array, "c", *map(str, shard[:level - 1])])]


def _compare_listings(store: Path, mnt: Path, view: str, arrays: dict[str, int], per: int = 2,
                      open_arrays: tuple[str, ...] = ()) -> dict:
    """Every directory of every array in the mount, listed by the reader, and every chunk file
    stat'ed by it: each name it sees, and each file it stats, it must be able to see in the
    store (list every directory that name comes from; stat the shard). Under `open_arrays`
    (nothing closed in the store) the reader lists every directory as root does."""
    dirs, files, names = [], [], {}
    for array in arrays:
        for dirpath, dirnames, filenames in os.walk(mnt / array):
            dirs.append(Path(dirpath))
            names[dirpath] = sorted(dirnames + filenames)
            files += [Path(dirpath) / f for f in filenames if f not in META]
    assert files, f"{view}: root sees no chunk files"
    seen = reader_sees([("names", d) for d in dirs] + [("stat", f) for f in files])
    shut = [d for d in dirs if any(str(d).startswith(f"{mnt / a}") for a in open_arrays) and seen[("names", str(d))] != names[str(d)]]
    assert not shut, f"{view}: the reader does not list (all of) {shut[:4]} through the mount, all open in the store"
    wanted: dict[str, list[str]] = {}  # "what the reader saw" -> store directories it needs

    def chunk_coords(rel: Path) -> tuple[str, list[int]] | None:
        array = next((a for a in arrays if rel.parts[:len(Path(a).parts)] == Path(a).parts), None)
        rest = list(rel.parts[len(Path(array).parts):]) if array else []
        if view == "zarr" and rest[:1] == ["c"]:
            rest = rest[1:]
        return (array, [int(x) for x in rest]) if rest and all(x.isdigit() for x in rest) else None

    for d in dirs:
        for name in seen[("names", str(d))] or []:
            found = chunk_coords((d / name).relative_to(mnt))
            if found is not None:
                array, coords = found
                wanted[f"{d / name} (listed)"] = _entry_sources(store, view, array, coords, arrays[array], per)
    for f in files:
        if seen[("stat", str(f))]:
            array, coords = chunk_coords(f.relative_to(mnt))
            coords = coords[::-1] if view == "n5" else coords
            wanted[f"{f} (stat)"] = ["/".join([array, "c", *(str(c // per) for c in coords)])]
    needed = sorted({s for srcs in wanted.values() for s in srcs})
    asked = {s: ("stat" if (store / s).is_file() else "names", str(store / s)) for s in needed}
    can = reader_sees(list(asked.values()))
    ok = {s for s in needed if can[asked[s]] is not None}
    wider = sorted(what for what, srcs in wanted.items() if not set(srcs) <= ok)
    assert not wider, f"{view}: the reader sees through the mount what the store hides: {wider[:6]} ({len(wider)})"
    return {"seen": len(wanted), "dirs": len(dirs)}


@pytest.mark.parametrize("view", ["zarr", "zarr2", "n5"])
def test_listings_show_no_name_the_store_hides_from_the_reader(public_tmp, template, reader, view):
    """Random rounds, while mounted with allow_other: row directories (`c/0`, `c/1`), `c/` and
    the array directory of two arrays closed (0700, or an ACL that denies the reader) or opened
    again; within a few seconds, every name the reader lists through the mount (chunk
    directories and chunk files, in each directory of the three views) it can list in the
    store directories it comes from, and every chunk file it stats there it can stat the
    shard of in the store; and it still reads what the store lets it (`_compare`)."""
    s = public_tmp / "rows.zarr"
    _group(s)
    _group(s / "g")
    _put_array(template, s / "g/a")
    _put_array(template, s / "b")
    for p in [s, *s.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    levels = [s / "g/a/c/0", s / "g/a/c/1", s / "b/c/0", s / "b/c/1", s / "b/c", s / "g/a"]
    mnt = public_tmp / "mnt"
    mnt.mkdir()
    mnt.chmod(0o755)
    rng = random.Random(f"{view}-{time.time_ns()}")
    first = [s / "g/a/c/0", s / "b/c/1"]  # (the first round closes a row of each: the case of the attack)
    # the N5 view reverses the axes: a chunk directory spans every row directory, and shows the
    # narrowest of their bits (a closed row closes its open neighbours' chunks too: narrower)
    state = {d: "open" for d in levels}
    with zvfs_mount(s, mnt, options=["allow_other", f"view={view}"]):
        # the reader first, on a fresh mount (bits learned when a directory is shown: a group's
        # listing shows its arrays' directories, and the kernel holds what it showed)
        first_look = reader_sees([("names", mnt / d) for d in ("", "g", "g/a", "b")])
        assert all(names for names in first_look.values()), (view, first_look)
        for n in range(4):
            for d in first if n == 0 else rng.sample(levels, rng.randint(1, 3)):
                how = state[d] = "0700" if n == 0 else rng.choice(["0700", "deny", "open"])
                if how == "deny":
                    set_acl(d, f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x")
                else:
                    set_acl(d, "u::rwx,g::r-x,o::r-x")
                    d.chmod(0o700 if how == "0700" else 0o755)
            shut = {a for a in ("g/a", "b") if any(state[d] != "open" for d in levels if f"{d}/".startswith(f"{s / a}/"))}
            narrow = tuple(f"{a}/c/" for a in shut) if view == "n5" else ()
            opened = tuple(a for a in ("g/a", "b") if a not in shut)
            started = time.monotonic()
            got = _settle(lambda: (_compare_listings(s, mnt, view, {"g/a": 2, "b": 2}, open_arrays=opened),
                                   _compare(s, mnt, view, narrow))[0], 6.0)
            log = " ".join(f"{d.relative_to(s)}={oct(d.stat().st_mode & 0o777)}" for d in levels)
            print(f"{view}: listings matched the store after {time.monotonic() - started:.1f} s ({got}; {log})")


async def test_which_store_directories_a_chunk_directory_stands_for(public_tmp):
    """FUSE-free, 3-d (shards of 2x2x2 chunks, 2x2x2 shards), `c/0/1` closed to others: in the
    Zarr view `c/i/j` is `c/(i//2)/(j//2)` of the store; in the N5 view (axes reversed: `k/j/i`)
    a directory of files `k/j` is every `c/*/(j//2)`, a directory `k` every `c/*`, and the array
    directory lists what every `c/*/*` lists (its read bits, not its search bits)."""
    from zvfs.core.source import open_source
    from zvfs.options import MountOptions

    src = public_tmp / "cube.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    for name, fill in (("a", 0), ("f", 7), ("o", 0)):  # (f: N5 shows its missing blocks, as fill blocks)
        g.create_array(name, shape=(8, 8, 8), shards=(4, 4, 4), chunks=(2, 2, 2), dtype="uint8", fill_value=fill,
                       compressors=None)[...] = 1
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (src / "a/c/0/1").chmod(0o700)
    (src / "f/c/0/1").chmod(0o700)
    want = {"zarr": {"a/c": 0o555, "a/c/0": 0o555, "a/c/1": 0o555, "a/c/0/0": 0o555, "a/c/0/1": 0o555,
                     "a/c/0/2": 0o500, "a/c/1/3": 0o500, "a/c/2/2": 0o555, "a": 0o555},
            "n5": {"a/0": 0o555, "a/3": 0o555, "a/0/0": 0o555, "a/3/1": 0o555, "a/0/2": 0o500, "a/3/3": 0o500,
                   "a": 0o511, "f/0/2": 0o500, "f/0/0": 0o555, "f": 0o511}}
    for view, modes in want.items():
        opened = await open_source(str(src), MountOptions(view=view))
        try:
            rows = await opened.tree.root.rows()  # (first: the arrays' directories as a listing shows them)
            names, _, _, _, stamps, _ = rows.window(0, len(rows))
            shown = {n: s.mode & 0o555 for n, s in zip(names, stamps) if n in ("a", "f", "o")}
            assert shown == ({"a": 0o555, "f": 0o555, "o": 0o555} if view == "zarr" else {"a": 0o511, "f": 0o511, "o": 0o555}), shown
            got = {}
            for path in modes:
                node = await opened.tree.resolve(path)
                await node.ready()
                got[path] = node.stamp().mode & 0o555
            assert got == modes, (view, {p: oct(m) for p, m in got.items()})
            rows = await (await opened.tree.resolve("a/c/0" if view == "zarr" else "a/0")).rows()
            names, _, _, _, stamps, _ = rows.window(0, len(rows))
            shown = {n: s.mode & 0o555 for n, s in zip(names, stamps)}
            assert shown == {"0": 0o555, "1": 0o555, "2": 0o500, "3": 0o500}, (view, shown)
        finally:
            await opened.store.aclose()


@pytest.mark.parametrize("looked_at", ["inotify", "stat each"])
async def test_numbered_subdirectories_kept_as_a_set_follow_the_store(public_tmp, reader, looked_at):
    """FUSE-free: `learn_subdirs` (what an N5 chunk directory spanning thousands of row
    directories learns their bits from: one scan of each parent): the distinct bits of the
    subdirectories named by a number in the range, folded with the directories above them. A
    chmod, an ACL, a row directory replaced by a symlink (its bits are its target's walk's:
    closed), or a directory above narrowed, is a change at the next look; names outside the
    range, not canonical numbers, or files, are not counted."""
    root = public_tmp / "s"
    for name in ("0", "1", "2", "3", "4"):
        (root / "a/c" / name).mkdir(parents=True)
    for name in ("7", "x", "01"):  # (outside the range, not a number, not as a grid names it)
        (root / "a/c" / name).mkdir(mode=0o700)
    (root / "a/c/5").write_bytes(b"a file: nothing below it")
    (root / "a/c/5").chmod(0o600)
    store = LocalStore(str(root))
    _unwatched(store, looked_at == "stat each")
    names = range(6)
    try:
        assert store.known_subdirs("a/c", names) is None
        assert await store.learn_subdirs("a/c", names) == [(0, 0, 0o755)]
        assert store.known_subdirs("a/c", names) == [(0, 0, 0o755)]
        assert store.known_subdirs("a/c", range(8)) is None, "another range is not known"
        assert not await store.directories_changed()
        (root / "a/c/3").chmod(0o700)
        assert await store.directories_changed(), "a row directory narrowed"
        store.forget_directories()
        assert sorted(await store.learn_subdirs("a/c", names)) == [(0, 0, 0o700), (0, 0, 0o755)]
        assert not await store.directories_changed()
        (root / "a/c/3").chmod(0o755)
        assert await store.directories_changed(), "widened again"
        store.forget_directories()
        await store.learn_subdirs("a/c", names)
        set_acl(root / "a/c/2", f"u::rwx,u:{reader}:---,g::r-x,m::r-x,o::r-x")
        assert await store.directories_changed(), "an ACL"
        store.forget_directories()
        got = await store.learn_subdirs("a/c", names)
        assert len(got) == 2 and (0, 0, 0o755) in got, got
        shutil.rmtree(root / "a/c/2")
        (root / "a/c/2").symlink_to("1")
        assert await store.directories_changed(), "a row directory replaced by a link"
        store.forget_directories()
        assert set(await store.learn_subdirs("a/c", names)) == {(0, 0, 0o755)}, "a link to an open row directory"
        (root / "closed").mkdir(mode=0o700)
        (root / "a/c/2").unlink()
        (root / "a/c/2").symlink_to("../../closed")
        store.forget_directories()  # (a link retargeted is followed anew at `zvfs refresh`)
        assert set(await store.learn_subdirs("a/c", names)) == {(0, 0, 0o755), (0, 0, 0o700)}, "its target's bits"
        (root / "a/c/2").unlink()
        (root / "a/c/2").symlink_to("/etc")
        store.forget_directories()
        assert set(await store.learn_subdirs("a/c", names)) == {(0, 0, 0o755)}, "one leading outside lists nothing"
        (root / "a/c/2").unlink()
        (root / "a/c/2").mkdir()
        store.forget_directories()
        assert await store.learn_subdirs("a/c", names) == [(0, 0, 0o755)]
        assert not await store.directories_changed()
        (root / "a").chmod(0o700)
        assert await store.directories_changed(), "a directory above"
        store.forget_directories()
        assert await store.learn_subdirs("a/c", names) == [(0, 0, 0o700)], "folded with the directories above"
        assert await store.learn_subdirs("a/c/0", names) == [], "no subdirectory"
        assert await store.learn_subdirs("a/none", names) is None, "not a directory"
    finally:
        await store.aclose()


async def test_a_walked_link_replaced_or_retargeted_is_a_change(public_tmp):
    """FUSE-free, with inotify: a row directory that is a symlink into a 0700 directory, walked
    (its walk is the target's), then replaced by an open directory, or by a link made beside it
    and renamed over it (`ln -sfn`): a change at the next look (an outside attacker: replaced
    by a directory, the zarr and zarr2 views stayed closed until `zvfs refresh`)."""
    root = public_tmp / "s"
    (root / "a/c/0").mkdir(parents=True)
    (root / "closed/c1").mkdir(parents=True)
    (root / "closed").chmod(0o700)
    (root / "a/c/1").symlink_to("../../closed/c1")
    store = LocalStore(str(root))
    try:
        assert (await store.learn_dir("a/c/1"))[2] == 0o700
        assert not await store.directories_changed()
        (root / "a/c/1").unlink()
        (root / "a/c/1").mkdir()
        assert await store.directories_changed(), "a link replaced by a directory"
        store.forget_directories()
        shutil.rmtree(root / "a/c/1")
        (root / "a/c/1").symlink_to("../../closed/c1")
        assert (await store.learn_dir("a/c/1"))[2] == 0o700
        assert not await store.directories_changed()
        (root / "a/c/1.new").symlink_to("0")
        os.replace(root / "a/c/1.new", root / "a/c/1")
        assert await store.directories_changed(), "a link retargeted by a rename over it"
        store.forget_directories()
        assert (await store.learn_dir("a/c/1"))[2] == 0o755
    finally:
        await store.aclose()


async def test_numbered_subdirectories_are_scanned_again_only_when_an_event_names_them(public_tmp, monkeypatch):
    """FUSE-free, with inotify: the set of a parent's numbered subdirectories is scanned again
    at a look when an event names the parent or one of them, not when a look compares a
    directory walked since (a listing of 4,100 shards walked hundreds below `c/` between two
    looks, and each look scanned `c/`'s 4,100 entries again)."""
    from zvfs.storage import local

    root = public_tmp / "s"
    for name in range(50):
        (root / f"a/c/{name}").mkdir(parents=True)
    scans = []
    real = local.subdir_facts
    monkeypatch.setattr(local, "subdir_facts", lambda *a: scans.append(a[0]) or real(*a))
    store = LocalStore(str(root))
    try:
        assert await store.learn_subdirs("a/c", range(50)) == [(0, 0, 0o755)]
        assert not await store.directories_changed()
        scans.clear()
        for name in range(10):
            assert await store.learn_dir(f"a/c/{name}") is not None
        assert not await store.directories_changed()
        assert scans == [], "walks below it are no reason to scan it again"
        (root / "a/c/42").chmod(0o700)
        assert await store.directories_changed()
        assert scans == [str(root / "a/c")], scans
    finally:
        await store.aclose()


async def test_a_span_past_span_max_is_folded_from_its_parents(public_tmp, monkeypatch):
    """FUSE-free, the N5 view of `test_which_store_directories_a_chunk_directory_stands_for`'s
    cube with SPAN_MAX lowered: spans of more row directories than it are folded from a scan
    of their parents (the same bits as walking each); past SPAN_MAX parents, shown closed."""
    from zvfs.core.source import open_source
    from zvfs.options import MountOptions
    from zvfs.views import chunkbits

    src = public_tmp / "cube.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    g.create_array("a", shape=(8, 8, 8), shards=(4, 4, 4), chunks=(2, 2, 2), dtype="uint8", fill_value=0,
                   compressors=None)[...] = 1
    for p in [src, *src.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    # `a` lists what every c/*/* lists (4 row directories, 2 parents), `a/0` every c/* (2, 1
    # parent: `c`), a directory of files `a/0/j` every c/*/(j//2) (2, 2 parents); shown closed,
    # `a` would be 0o511 (root's, and the search bits), the others 0o000
    rounds = [(3, None, {"a": 0o555, "a/0/0": 0o555}),
              (3, "a/c/0/1", {"a": 0o511, "a/0/2": 0o500, "a/0/0": 0o555}),  # (files' by a walk of each)
              (1, None, {"a/0": 0o555, "a/0/2": 0o000, "a": 0o511}),
              (1, "a/c/1", {"a/0": 0o500, "a/0/2": 0o000})]
    for span_max, close, want in rounds:
        monkeypatch.setattr(chunkbits, "SPAN_MAX", span_max)
        if close:
            (src / close).chmod(0o700)
        opened = await open_source(str(src), MountOptions(view="n5"))
        try:
            got = {}
            for path in want:
                node = await opened.tree.resolve(path)
                await node.ready()
                got[path] = node.stamp().mode & 0o555
            assert got == want, (span_max, {p: oct(m) for p, m in got.items()})
        finally:
            await opened.store.aclose()


def test_an_n5_directory_spanning_thousands_of_row_directories_reads_as_the_store_says(public_tmp, reader):
    """An array of 4,100 shard rows (`c/0` .. `c/4099`), mounted with allow_other in the N5
    view, where each chunk directory spans every row directory (N5 paths name the last axis
    first): a reader lists and reads it as the store lets them (before: shown closed to all
    but root past 4,096 row directories); one row directory closed closes those directories
    within a few seconds, and opened again, opens them."""
    rows = 4100
    src = public_tmp / "tall.zarr"
    data = np.arange(1, rows * 2 + 1, dtype=np.uint16).reshape(rows, 2)  # (no chunk of the fill value: all stored)
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    g.create_array("a", shape=data.shape, shards=(1, 2), chunks=(1, 1), dtype="uint16", compressors=None)[...] = data
    (src / "alt").mkdir()  # (a row directory that is a symlink: followed, as the kernel does)
    (src / "a/c/2000").rename(src / "alt/2000")
    (src / "a/c/2000").symlink_to("../../alt/2000")
    for p in [src, *src.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert len(list((src / "a/c").iterdir())) == rows
    mnt = public_tmp / "mnt"
    mnt.mkdir()
    mnt.chmod(0o755)
    with zvfs_mount(src, mnt, options=["allow_other", "view=n5"]) as m:
        a = m / "a"
        chunk = a / "1" / str(rows - 3)  # (N5: x/y, so chunk (rows - 3, 1) of the array)
        as_root = chunk.read_bytes()
        assert np.frombuffer(as_root[-2:], ">u2")[0] == data[rows - 3, 1], "the chunk's value, big-endian after its header"
        r = as_reader("cat", chunk)
        assert r.returncode == 0 and r.stdout == as_root, r.stderr.decode()[-500:]
        linked = as_reader("cat", a / "0/2000")
        assert linked.returncode == 0 and linked.stdout == (a / "0/2000").read_bytes(), linked.stderr.decode()[-500:]
        seen = reader_sees([("names", a), ("names", a / "0")])
        assert seen[("names", str(a))] == ["0", "1", "attributes.json"], seen[("names", str(a))]
        assert len(seen[("names", str(a / "0"))]) == rows

        def closed():
            assert as_reader("cat", chunk).returncode != 0, "a row directory closed closes every N5 directory spanning it"
            assert as_reader("test", "-r", a / "1").returncode != 0, "nor can it be listed"

        def opened():
            r = as_reader("cat", chunk)
            assert r.returncode == 0 and r.stdout == as_root, r.stderr.decode()[-500:]
            assert as_reader("test", "-r", a / "1").returncode == 0

        # meanwhile root lists `a/0` again and again (4,100 shard indexes: seconds each), which
        # keeps the daemon busy: the watch still looks every second (before, a look that waited
        # for the busy loop counted as costly, and the next came 9-18 s later). (Not `a/1`:
        # the kernel holds a directory's lock while it is read, and a lookup in it waits.)
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                os.listdir(a / "0")

        lister = threading.Thread(target=busy)
        lister.start()
        try:
            time.sleep(1)
            (src / "a/c" / str(rows - 1)).chmod(0o700)
            _settle(closed, 4.0)
            assert chunk.read_bytes() == as_root, "root still reads it"
            (src / "a/c" / str(rows - 1)).chmod(0o755)
            _settle(opened, 4.0)
        finally:
            stop.set()
            lister.join()
