"""The command line as users and mount(8) meet it: --version, unknown commands, the bare form
mount.fuse3 runs, mount(8)'s exit codes, completion and man page, one-line failures, umount of
zvfs mounts only (from the mount table), doctor, inspect of a store with damaged shards."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import ZVFS, force_unmount, is_mounted, run_zvfs, zvfs_mount
from test_cli import _one_line

import zvfs
from zvfs.names import View
from zvfs.options import OWN

SAMPLE = zvfs.SAMPLE_STORE
REPO = Path(__file__).resolve().parents[1]
MOUNT_ZVFS = Path(sys.executable).parent / "mount.zvfs"
COMMANDS = ["mount", "umount", "ls", "cat", "inspect", "stats", "refresh", "doctor", "serve"]



def _same_as_sample(mnt: Path) -> None:
    """zarr-python reads the mount like the sharded original."""
    for path in ("raw/0", "labels"):
        assert np.array_equal(zarr.open_array(mnt / path, mode="r")[...], zarr.open_array(Path(SAMPLE) / path, mode="r")[...])


# --------------------------------------------------------------------------- surface


def test_version_is_the_packages():
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    r = run_zvfs("--version")
    assert r.returncode == 0
    assert r.stdout.decode().strip() == f"zvfs {want}"


@pytest.mark.parametrize("argv", [["mout", SAMPLE, "{mnt}"], ["frobnicate"], ["umonut", "{mnt}"]])
def test_an_unknown_command_is_named_and_never_mounts(tmp_path, argv):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_zvfs(*[a.format(mnt=mnt) for a in argv])
    assert r.returncode == 2
    msg = _one_line(r.stderr)
    assert f"unknown command '{argv[0]}'" in msg
    assert not is_mounted(mnt)


def test_the_bare_form_mounts_as_mount_fuse3_runs_it(tmp_path):
    """mount.fuse3 runs `zvfs SOURCE DIR -o ro,dev,suid` (as root): that must mount."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = run_zvfs(SAMPLE, mnt, "-o", "ro,dev,suid")
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert os.path.ismount(mnt)
        _same_as_sample(mnt)
    finally:
        force_unmount(mnt)


@pytest.mark.parametrize("how", ["bare", "mount.zvfs", "mount -t zvfs"])
def test_mount_helper_failures_use_mount_8_codes(tmp_path, how):
    """mount(8): 32 for a mount failure, 1 for incorrect invocation."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    missing = tmp_path / "no-such-store"
    cmd = {"bare": [*ZVFS], "mount.zvfs": [str(MOUNT_ZVFS)], "mount -t zvfs": None}[how]
    for source, opts, want in ((missing, "ro", 32), (SAMPLE, "ro,no_such_option", 1)):
        if cmd is None:
            if not os.access("/sbin/mount.zvfs", os.X_OK):
                pytest.fail("/sbin/mount.zvfs is missing: run scripts/setup (mount(8) finds helpers in /sbin only)")
            argv = ["mount", "-t", "zvfs", str(source), str(mnt), "-o", opts]
        else:
            argv = [*cmd, str(source), str(mnt), "-o", opts]
        r = subprocess.run(argv, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == want, (argv, r.stderr)
        msg = _one_line(r.stderr)
        assert ("no_such_option" if want == 1 else "no-such-store") in msg
        assert not is_mounted(mnt)


def test_mount_8_fake_mount_through_the_helper_mounts_nothing(tmp_path):
    """`mount -f` ("fake": everything but the mount system call) passes -f to helpers."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = subprocess.run([str(MOUNT_ZVFS), SAMPLE, str(mnt), "-f", "-o", "ro", "-t", "zvfs"], capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stderr == b""
        assert not is_mounted(mnt)
        r = subprocess.run([str(MOUNT_ZVFS), SAMPLE, str(mnt), "-n", "-o", "ro", "-t", "zvfs"], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        _same_as_sample(mnt)
    finally:
        force_unmount(mnt)


def test_bash_completion_is_generated_from_the_parser(tmp_path):
    r = run_zvfs("--print-completion", "bash")
    assert r.returncode == 0
    script = tmp_path / "zvfs.bash"
    script.write_bytes(r.stdout)
    fn = next(line.split("()")[0].strip() for line in r.stdout.decode().splitlines() if line.startswith("_shtab_zvfs()"))

    def complete(*words: str) -> list[str]:
        probe = (f"source {script}; COMP_WORDS=(zvfs {' '.join(words)}); COMP_CWORD={len(words)}; "
                 f"{fn}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert set(complete("")) >= set(COMMANDS)
    assert complete("um") == ["umount"]
    assert "--strict" in complete("inspect", "--")
    assert "--lazy" in complete("umount", "--")
    assert complete("--print-completion", "") == ["bash", "zsh", "tcsh"]
    for command in ("mount", "ls", "cat", "inspect"):
        assert complete(command, "--view", "") == ["zarr", "zarr2", "n5", "precomputed"], command
    assert complete("mount", "--view", "zarr") == ["zarr", "zarr2"]
    assert complete("mount", "-o", "allow_") == ["allow_other", "allow_root"]
    assert complete("mount", "-o", "ro,nonem") == ["ro,nonempty"]
    assert "view=" in complete("inspect", "-o", "")
    refused = run_zvfs("--print-completion", "cmd")
    assert refused.returncode == 2 and b"invalid choice: 'cmd'" in refused.stderr


def test_man_page_is_generated_from_the_parser(tmp_path):
    for tool in ("groff", "col", "lexgrog"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs groff-base, bsdextrautils, man-db)")
    r = run_zvfs("--print-man")
    assert r.returncode == 0
    page = tmp_path / "zvfs.1"
    page.write_bytes(r.stdout)
    # whatis and apropos index the NAME line through lexgrog: it must parse, with a description
    name = subprocess.run(["lexgrog", str(page)], capture_output=True, text=True, timeout=30)
    assert name.returncode == 0 and '"zvfs - ' in name.stdout and "sharded" in name.stdout, name.stdout + name.stderr
    rendered = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(page)], capture_output=True, timeout=30)
    assert rendered.returncode == 0, rendered.stderr
    text = subprocess.run(["col", "-b"], input=rendered.stdout, capture_output=True).stdout.decode()
    for word in [*COMMANDS, "--foreground", "--lazy", "--strict", "--json", "MOUNTPOINT", "SOURCE"]:
        assert word in text, f"{word} missing from the man page"
    for name in ("mount", "inspect"):  # every option a command's --help shows is on the page
        helptext = run_zvfs(name, "--help").stdout.decode()
        for opt in {w.strip(",[]") for w in helptext.split() if w.startswith("--") and len(w) > 3} - {"--help"}:
            assert opt in text, f"{opt} of '{name}' missing from the man page"
    assert "--sample-path" in text
    sections = _man_sections(text)
    options = sections["MOUNT OPTIONS"]
    for opt in OWN:  # every -o option, with a value where it takes one
        assert opt + ("" if OWN[opt][1] == "flag" else "=") in options, f"-o {opt} missing from MOUNT OPTIONS"
    status = sections["EXIT STATUS"]
    tags = {ln.split()[0] for ln in status.splitlines() if ln.startswith(" " * 7) and not ln.startswith(" " * 8)}
    assert {"0", "1", "2", "3", "128+N"} <= tags and "141 (SIGPIPE)" in status, status


def _man_sections(text: str) -> dict[str, str]:
    """A rendered page's sections by heading (headings are the unindented lines)."""
    out, heading = {}, None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.isupper():
            heading = line.strip()
            out[heading] = ""
        elif heading:
            out[heading] += line + "\n"
    return out


# --------------------------------------------------------------------------- one-line failures


def _deep_store(tmp_path: Path) -> Path:
    src = tmp_path / "deep.zarr"
    src.mkdir()
    depth = 200_000
    (src / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {"x": ' + "[" * depth + "]" * depth + "}}")
    return src


@pytest.mark.parametrize("case", ["log=/nonexistent/x", "ftp://", "ftp:// mount", "http://[::1", "http://[::1 mount",
                                  "deep JSON ls", "deep JSON mount", "no arguments"])
def test_every_failure_is_one_line(tmp_path, case):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    deep = _deep_store(tmp_path) if case.startswith("deep") else None
    args, status = {
        "log=/nonexistent/x": (["mount", SAMPLE, mnt, "-o", "log=/nonexistent/x"], 2),
        "ftp://": (["ls", "ftp://127.0.0.1:1/store"], 2),
        "ftp:// mount": (["mount", "ftp://127.0.0.1:1/store", mnt], 2),
        "http://[::1": (["inspect", "http://[::1/store"], 2),
        "http://[::1 mount": (["mount", "http://[::1/store", mnt], 2),
        "deep JSON ls": (["ls", deep], 2),
        "deep JSON mount": (["mount", deep, mnt], 2),
        "no arguments": ([], 2),
    }[case]
    try:
        r = run_zvfs(*args)
        msg = _one_line(r.stderr)
        assert r.returncode == status, msg
        assert not is_mounted(mnt)
        if case.startswith("deep"):
            assert "zarr.json" in msg and "deep" in msg
        if case == "log=/nonexistent/x":
            assert "/nonexistent/x" in msg
    finally:
        force_unmount(mnt)


# --------------------------------------------------------------------------- umount


def test_umount_refuses_what_is_not_zvfs_and_says_not_mounted(tmp_path):
    other = tmp_path / "tmpfs"
    other.mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "zvfs-test-tmpfs", str(other)], check=True)
    try:
        r = run_zvfs("umount", other)
        assert r.returncode == 1
        assert "not a zvfs mount" in _one_line(r.stderr)
        assert os.path.ismount(other), "zvfs umount unmounted a tmpfs"
        r = run_zvfs("umount", plain)
        assert r.returncode == 1
        assert "not mounted" in _one_line(r.stderr)
    finally:
        subprocess.run(["umount", "-l", str(other)], check=False)


def test_umount_clears_the_stale_mount_of_a_killed_daemon(tmp_path):
    mnt = tmp_path / "mnt"
    with zvfs_mount(SAMPLE, mnt):
        pids = subprocess.run(["pgrep", "-f", f"zvfs mount {SAMPLE} {mnt}"], capture_output=True, text=True).stdout.split()
        assert pids, "daemon process not found"
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.3)
        with pytest.raises(OSError) as e:
            os.listdir(mnt)
        assert e.value.errno == 107  # ENOTCONN
        r = run_zvfs("umount", mnt)
        assert r.returncode == 0, r.stderr
        assert not is_mounted(mnt)


@contextlib.contextmanager
def _autofs(point: Path):
    """An autofs mount point whose daemon is a pipe we hold: any access that would trigger it
    writes a packet into the pipe (and would block until answered). Yields the pipe's read
    end (non-blocking); unmounted after."""
    r, w = os.pipe()
    holder = subprocess.Popen(["sleep", "120"], start_new_session=True)  # the automount daemon's process group
    try:
        subprocess.run(["mount", "-t", "autofs", "-o", f"fd={w},pgrp={holder.pid},minproto=5,maxproto=5,direct",
                        "zvfs-test-autofs", str(point)], check=True, pass_fds=(w,))
        os.close(w)
        os.set_blocking(r, False)
        yield r
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        holder.kill()
        holder.wait()
        os.close(r)


def test_mount_point_checks_never_trigger_an_automount(tmp_path):
    point = tmp_path / "auto"
    point.mkdir()
    with _autofs(point) as r:
        for args in (["umount", point], ["stats", point], ["refresh", point]):
            res = run_zvfs(*args, timeout=20)
            assert res.returncode == 1
            assert "not a zvfs mount" in _one_line(res.stderr)
        with pytest.raises(BlockingIOError):
            os.read(r, 4096)  # no automount request was sent


# --------------------------------------------------------------------------- doctor


def test_doctor_passes_on_a_machine_set_up_by_scripts_setup():
    r = run_zvfs("doctor")
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    lines = [ln for ln in out.splitlines() if not ln.startswith(" ")]
    assert len(lines) >= 6 and all(ln.startswith("ok") for ln in lines), out
    for what in ("fusermount3", "mount.fuse3", "/dev/fuse", "user_allow_other", "standard PATH", "/sbin/mount.zvfs"):
        assert what in out


def test_doctor_says_what_to_fix_when_dev_fuse_is_missing():
    """In a mount namespace whose /dev is an empty tmpfs (a container without the device)."""
    script = f"mount -t tmpfs none /dev && exec {' '.join(ZVFS)} doctor"
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    out = r.stdout.decode()
    assert r.returncode == 1, out
    bad = [ln for ln in out.splitlines() if ln.startswith("MISSING")]
    assert len(bad) == 1 and "/dev/fuse" in bad[0], out
    assert "fix:" in out and "modprobe fuse" in out


# --------------------------------------------------------------------------- inspect


@pytest.fixture
def damaged(tmp_path):
    """The sample store with two shards of raw/0 damaged: an index checksum (crc32c) byte
    flipped, and one shard truncated."""
    src = tmp_path / "damaged.zarr"
    shutil.copytree(SAMPLE, src)
    flipped, truncated = src / "raw/0/c/0/1/0", src / "raw/0/c/1/0/0"
    with open(flipped, "r+b") as f:
        f.seek(-6, os.SEEK_END)  # inside the index (at the end), before its 4-byte checksum
        b = f.read(1)
        f.seek(-6, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))
    os.truncate(truncated, 100)
    return src, {"raw/0/c/0/1/0", "raw/0/c/1/0/0"}


def test_inspect_lists_damaged_shards_and_goes_on(damaged):
    src, bad = damaged
    r = run_zvfs("inspect", "--json", src)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    arrays = {a["path"]: a for a in json.loads(r.stdout)["arrays"]}
    assert set(arrays) == {"labels", "raw/0", "raw/1", "raw/2"}
    listed = arrays["raw/0"]["problems"]
    assert sorted(k for k in bad if any(k in p for p in listed)) == sorted(bad) and len(listed) == 2, listed
    assert any("crc32c" in p for p in listed)
    pristine = {a["path"]: a for a in json.loads(run_zvfs("inspect", "--json", SAMPLE).stdout)["arrays"]}
    for path in ("labels", "raw/1", "raw/2"):  # the other arrays are reported in full
        assert arrays[path]["problems"] == []
        assert arrays[path]["chunks_present"] == pristine[path]["chunks_present"] > 0
    # raw/0: every shard is still counted, the damaged ones contribute no chunks
    assert arrays["raw/0"]["shards_present"] == pristine["raw/0"]["shards_present"]
    assert 0 < arrays["raw/0"]["chunks_present"] < pristine["raw/0"]["chunks_present"]
    text = run_zvfs("inspect", src)
    assert text.returncode == 0
    section = text.stdout.decode().split("\nraw/0\n", 1)[1].split("\n\n", 1)[0]
    assert sum("DAMAGED" in ln for ln in section.splitlines()) == 2
    strict = run_zvfs("inspect", "--strict", src)
    assert strict.returncode == 3
    clean = run_zvfs("inspect", "--strict", SAMPLE)
    assert clean.returncode == 0


def test_inspect_names_a_damaged_nested_shard_index(tmp_path):
    """Nested sharding (written by zarr-python): one inner shard's own index checksum broken."""
    import writers

    case = writers.CASES_BY_PATH["nested/two_level_2d"]
    assert case.index_location == "end" and case.index_crc
    src = tmp_path / "nested.zarr"
    writers.write_store(src, "zarr-python", cases=[case])
    shard = next(p for p in sorted((src / case.path / "c").rglob("*")) if p.is_file())
    raw = bytearray(shard.read_bytes())
    top = np.frombuffer(bytes(raw[-(16 * 2 + 4):-4]), dtype="<u8").reshape(-1, 2)  # chunk 8x10 / inner 4x10: 2 entries
    off, nbytes = (int(v) for v in top[top[:, 0] != 2**64 - 1][0])
    nested_index = off + nbytes - (16 * 4 + 4)  # inner 4x10 / nested 2x5: 4 entries, then the crc32c
    raw[nested_index + 1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    r = run_zvfs("inspect", "--json", src)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    (array,) = [a for a in json.loads(r.stdout)["arrays"] if a["path"] == case.path]
    rel = shard.relative_to(src).as_posix()
    assert len(array["problems"]) == 1 and rel in array["problems"][0] and "nested" in array["problems"][0], array["problems"]
    assert run_zvfs("inspect", "--strict", src).returncode == 3


def test_inspect_shows_progress_on_a_terminal_only():
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a terminal has a size
    try:
        p = subprocess.run([*ZVFS, "inspect", SAMPLE], stdout=subprocess.DEVNULL, stderr=secondary,
                           stdin=subprocess.DEVNULL, timeout=60)
        os.close(secondary)
        secondary = None
        shown = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if secondary is not None:
            os.close(secondary)
        os.close(primary)
    assert p.returncode == 0
    assert b"raw/0" in shown and b"shard" in shown, shown[:500]
    piped = run_zvfs("inspect", SAMPLE)
    assert piped.returncode == 0 and piped.stderr == b""


# --------------------------------------------------------------------------- pipes, the sample, exit statuses


def _into_a_closed_pipe(*args) -> subprocess.CompletedProcess:
    """`zvfs ARGS | head` when head has gone already: stdout is a pipe with no reader."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*ZVFS, *map(str, args)], stdout=w, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.close(w)


@pytest.mark.parametrize("args", [["inspect", SAMPLE], ["inspect", "--json", SAMPLE], ["ls", SAMPLE, "raw/0/c/0"],
                                  ["cat", SAMPLE, "raw/0/c/0/0/0"], ["--help"], ["mount", "--help"], ["--print-man"],
                                  ["--print-completion", "bash"], ["--sample-path"], ["--version"]],
                         ids=lambda a: " ".join(a).replace(SAMPLE, "SAMPLE"))
def test_a_reader_that_goes_away_ends_the_command_quietly(args):
    """As `cat` ends (killed by SIGPIPE: 141 in the shell), with no message."""
    r = _into_a_closed_pipe(*args)
    assert (r.returncode, r.stderr) == (141, b"")


def test_stats_into_a_closed_pipe_and_as_text(tmp_path):
    with zvfs_mount(SAMPLE, tmp_path / "mnt") as mnt:
        for args in (["stats", "--json", mnt], ["stats", mnt]):
            r = _into_a_closed_pipe(*args)
            assert (r.returncode, r.stderr) == (141, b""), args
        text = run_zvfs("stats", mnt).stdout.decode().splitlines()
        assert text[1].split() == ["source", SAMPLE] and text[2].split() == ["view", "zarr"], text


def test_zvfs_says_where_its_sample_is(tmp_path):
    """From a directory holding a `zvfs` folder (a checkout's parent), where `import zvfs` in a
    Python without zvfs installed finds that folder (a namespace package with no SAMPLE_STORE)."""
    (tmp_path / "zvfs").mkdir()
    r = subprocess.run([str(Path(sys.executable).parent / "zvfs"), "--sample-path"], cwd=tmp_path, capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stderr == b""
    path = Path(r.stdout.decode().strip())
    assert path == Path(SAMPLE) and (path / "raw" / "zarr.json").is_file()
    assert run_zvfs("ls", path).stdout.decode().split() == ["labels/", "raw/", "zarr.json"]


def test_inspect_lists_the_views_a_store_has_and_counts_in_words():
    doc = json.loads(run_zvfs("inspect", "--json", SAMPLE).stdout)
    assert doc["view"] == "zarr" and doc["views"] == ["zarr", "zarr2", "n5"]
    for view in View:  # the list is what `--view` accepts for this store
        r = run_zvfs("ls", "--view", view, SAMPLE)
        assert r.returncode == (0 if view in doc["views"] else 2), (view, r.stderr)
    text = run_zvfs("inspect", SAMPLE).stdout.decode()
    head = text.splitlines()
    assert head[0].endswith(": zarr3, zarr view, 4 arrays") and head[1].startswith("views: zarr, zarr2, n5 "), head[:2]
    assert "\nraw/2\n" in text and "present: 1 shard, 1 inner chunk, " in text.split("\nraw/2\n")[1], text
    one = run_zvfs("inspect", Path(SAMPLE) / "labels").stdout.decode().splitlines()[0]
    assert one.endswith(": zarr3, zarr view, 1 array"), one


UNREACHABLE = "http://127.0.0.1:1/store.zarr"  # connection refused at once


@pytest.mark.parametrize("case", ["mount URL", "ls URL", "cat URL", "inspect URL", "inspect missing", "mount missing",
                                  "mount on a file", "mount on nothing", "cat a missing path", "umount not mounted"])
def test_exit_statuses_follow_one_rule(tmp_path, case):
    """2: refused before doing anything (SOURCE, MOUNTPOINT, usage); 1: the work failed."""
    mnt, afile = tmp_path / "mnt", tmp_path / "afile"
    mnt.mkdir()
    afile.write_text("x")
    missing = tmp_path / "missing.zarr"
    args, status, words = {
        "mount URL": (["mount", UNREACHABLE, mnt], 2, "127.0.0.1:1"),
        "ls URL": (["ls", UNREACHABLE], 2, "127.0.0.1:1"),
        "cat URL": (["cat", UNREACHABLE, "zarr.json"], 2, "127.0.0.1:1"),
        "inspect URL": (["inspect", UNREACHABLE], 2, "127.0.0.1:1"),
        "inspect missing": (["inspect", missing], 2, str(missing)),
        "mount missing": (["mount", missing, mnt], 2, str(missing)),
        "mount on a file": (["mount", SAMPLE, afile], 2, "not a directory"),
        "mount on nothing": (["mount", SAMPLE, tmp_path / "nothing"], 2, "does not exist"),
        "cat a missing path": (["cat", SAMPLE, "raw/0/c/9/9/9"], 1, "no such file"),
        "umount not mounted": (["umount", mnt], 1, "not mounted"),
    }[case]
    try:
        r = run_zvfs(*args)
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)
    msg = _one_line(r.stderr)
    assert r.returncode == status and words in msg, (r.returncode, msg)


def test_the_units_documentation_is_installed():
    """systemd shows Documentation= in `systemctl help` and status: every entry must resolve."""
    unit = (REPO / "systemd" / "zvfs@.service").read_text()
    docs = [uri for line in unit.splitlines() if line.startswith("Documentation=") for uri in line.split("=", 1)[1].split()]
    assert docs
    for uri in docs:
        if uri.startswith("man:"):
            if shutil.which("man") is None:
                pytest.skip("man is not installed (scripts/setup installs man-db)")
            page, section = uri[4:].rstrip(")").split("(")
            r = subprocess.run(["man", "-w", section, page], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, f"{uri}: {r.stderr.strip()} (scripts/setup installs the page)"
        else:
            assert uri.startswith("file://") and Path(uri[7:]).is_file(), f"{uri} does not exist"
