"""The README's examples run as written on the sample store shipped with zvfs, and that sample
is what the README says it is (a valid OME-Zarr 0.5 image beside a plain array).

Every line of every code block in README.md (but the file map under "Layout") is classified;
a line of no known kind fails the test, so a new example is either run here or excused here
with its reason. Examples run in the README's order, as a user would type them: `/data/brain.zarr`
is the sample, `/data/image.ome.zarr` its `raw` image (the README says so), `/data/image.ozx`
that image zipped, each `/mnt/NAME` a
fresh directory; `python` is the interpreter that has the example's library (zarr-python and
tensorstore in this venv; ome-zarr-py 0.9 and z5py in the venv `scripts/setup-legacy` makes). A
mount of a remote placeholder (`s3://bucket/...`, `https://host/...`) has no server behind it: it
and the lines that use its mount point are skipped, and said so. A Python example that reads a
mount of the default view is run on the original too: both must print the same.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import force_unmount, is_mounted, run_zvfs
from test_legacy_tools import legacy_venvs  # noqa: F401  (the fixture: the legacy tools' venvs)

import zvfs

pytestmark = pytest.mark.mount

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SAMPLE = zvfs.SAMPLE_STORE
SOURCES = {"/data/brain.zarr": SAMPLE, "/data/image.ome.zarr": f"{SAMPLE}/raw"}
REMOTE = re.compile(r"^[a-z0-9]+://")
MOUNT_POINT = re.compile(r"/mnt/\w+")
#: words that mark a synopsis line (a placeholder the user fills in), not an example
PLACEHOLDERS = {"SOURCE", "MOUNTPOINT", "PATH", "SHELL", "DIR"}
#: the address `zvfs serve` examples listen on (its default)
README_SERVER = "127.0.0.1:8080"
#: what only the legacy venv has (an OME-NGFF 0.4 reader, an N5 reader, zarr-python 2.18)
LEGACY = ("ome_zarr", "z5py", "FSStore")


def zipped(directory: Path, archive: Path) -> Path:
    """The directory as a zip archive (stored entries, as an `.ozx` holds them)."""
    import zipfile

    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(directory).as_posix())
    return archive


def code_lines() -> list[tuple[str, str]]:
    """(section heading, line) of every line of every indented code block, in order."""
    out, section, in_code, prev = [], "", False, ""
    for line in README.read_text().splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        in_code = line.startswith("    ") and (in_code or not prev.strip())
        if in_code and section != "Layout":
            out.append((section, line[4:]))
        prev = line
    return out


def kind(line: str) -> str:
    words = shlex.split(line, comments=True)
    if not words:
        return "comment"
    if words[0] in ("scripts/demo", "scripts/test"):
        return "the README's two commands (what .ci/run runs; not inside the suite)"
    if words[0] in ("sudo", "pipx"):
        return "an installation step (changes the machine)"
    if words[0] == "zvfs" and PLACEHOLDERS & set(words):
        return "synopsis"
    if words[:2] == ["zvfs", "serve"]:
        return "serve"
    if words[0] in ("zvfs", "ls", "python", "mount", "curl"):
        return "command"
    if len(words) == 6 and words[2] == "fuse.zvfs":
        return "fstab"
    return "unknown"


def test_every_readme_code_line_is_known():
    unknown = [line for _, line in code_lines() if kind(line) == "unknown"]
    assert not unknown, f"README code lines of no known kind (run them here, or excuse them): {unknown}"
    kinds = [kind(line) for _, line in code_lines()]
    assert kinds.count("command") >= 12 and "fstab" in kinds, kinds  # the examples are found


def _mount_args(words: list[str]) -> tuple[str, str] | None:
    """(source, mount point) of a mount command: `zvfs mount S M ...` or `mount -t T S M ...`."""
    if words[:2] == ["zvfs", "mount"]:
        rest = words[2:]
    elif words[0] == "mount":
        rest = words[1:]
    else:
        return None
    positional, skip = [], False
    for w in rest:
        if skip:
            skip = False
        elif w in ("-t", "-o", "--view"):
            skip = True
        elif not w.startswith("-"):
            positional.append(w)
    return positional[0], positional[1]


class Run:
    """The examples' state: mount points (placeholder -> directory) and what is mounted there."""

    def __init__(self, tmp_path: Path, venvs: Path):
        self.tmp, self.venvs = tmp_path, venvs
        self.sources = {**SOURCES, "/data/image.ozx": str(zipped(Path(SAMPLE) / "raw", tmp_path / "image.ozx"))}
        self.dirs: dict[str, Path] = {}
        self.unavailable: set[str] = set()  # mount points of placeholder remote stores
        self.default_view: dict[str, str] = {}  # mount point -> source, for mounts of the default view
        self.skipped: list[str] = []
        self.server: subprocess.Popen | None = None  # the `zvfs serve` of the last serve example
        self.served = ""  # the address the README's examples use -> where that server listens

    def point(self, name: str) -> Path:
        if name not in self.dirs:
            self.dirs[name] = self.tmp / name.strip("/").replace("/", "-")
            self.dirs[name].mkdir()
        return self.dirs[name]

    def local(self, text: str) -> str:
        for placeholder, real in sorted(self.sources.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(placeholder, real)
        if self.served:
            text = text.replace(README_SERVER, self.served)
        return MOUNT_POINT.sub(lambda m: str(self.point(m.group())), text)

    def shell(self, line: str, python: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        if python is not None:
            line = python + line[len("python"):]
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300, env=env,
                              stdin=subprocess.DEVNULL)

    def serve(self, line: str) -> None:
        """A `zvfs serve` example: started in the background (on a free port: the lines after it
        that name the README's address are pointed there), the previous one stopped first; one
        of a placeholder remote store is skipped, with the lines that use it."""
        self.stop_server()
        words = shlex.split(line, comments=True)
        if REMOTE.match(words[2]):
            self.skipped.append(f"{line}  (a placeholder remote store)")
            return
        if "--listen" in words:
            at = words.index("--listen")
            del words[at:at + 2]
        cmd = [sys.executable, "-m", "zvfs", *[self.local(w) for w in words[1:]], "--listen", "127.0.0.1:0"]
        self.server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first = self.server.stdout.readline()  # type: ignore[union-attr]
        assert " at http://127.0.0.1:" in first, f"{line}: {first!r}"
        self.served = first.rsplit("http://", 1)[1].strip().rstrip("/")

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.terminate()
            assert self.server.wait(60) == 0, "zvfs serve did not exit 0 on SIGTERM"
            self.server, self.served = None, ""

    def command(self, line: str) -> None:
        words = shlex.split(line, comments=True)
        points = MOUNT_POINT.findall(line)
        if README_SERVER in line and not self.served:
            self.skipped.append(f"{line}  (uses the server of a placeholder remote store)")
            return
        mount = _mount_args(words)
        if mount is not None and REMOTE.match(mount[0]):
            self.unavailable.add(mount[1])
            self.unavailable.update(re.findall(r"cache_dir=([^,\s]+)", line))  # (`zvfs cache DIR` needs that mount)
            self.skipped.append(f"{line}  (a placeholder remote store)")
            return
        if mount is not None:  # a local store mounted there now
            self.unavailable.discard(mount[1])
        if any(p in self.unavailable for p in points) or words[:2] == ["zvfs", "cache"] and words[2] in self.unavailable:
            self.skipped.append(f"{line}  (uses the mount of a placeholder remote store)")
            return
        if mount is not None:
            self.fresh(mount[1])
            if "--view" not in words and "view=" not in line:
                self.default_view[mount[1]] = mount[0]
        python = None
        if words[0] == "python":
            python = str(self.venvs / "ome04" / "bin" / "python") if any(m in line for m in LEGACY) else sys.executable
        r = self.shell(self.local(line), python)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"{line}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
        if words[0] in ("ls", "python", "curl"):
            assert r.stdout.strip(), f"{line}: printed nothing"
        if words[0] == "python" and len(points) == 1 and points[0] in self.default_view:
            original = self.shell(self.local(line.replace(points[0], self.default_view[points[0]])), python)
            assert original.returncode == 0 and original.stdout == r.stdout, (
                f"{line}: the mount printed {r.stdout!r}, the original {original.stdout!r} {original.stderr}")

    def fstab(self, line: str) -> None:
        source, point = line.split()[:2]
        if REMOTE.match(source):
            self.skipped.append(f"{line}  (a placeholder remote store)")
            return
        self.fresh(point)
        table = self.tmp / "fstab"
        table.write_text(self.local(line) + "\n")
        r = subprocess.run(["mount", "-T", str(table), str(self.point(point))], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"fstab line {line}: {r.stderr}"
        assert sorted(os.listdir(self.point(point))) == ["labels", "raw", "zarr.json"]

    def fresh(self, point: str) -> None:
        """A mount example whose mount point an earlier example (an alternative) still holds:
        unmounted first, as a user trying the next one would."""
        if point in self.dirs and is_mounted(self.dirs[point]):
            r = run_zvfs("umount", self.dirs[point])
            assert r.returncode == 0, r.stderr

    def close(self) -> None:
        self.stop_server()
        for d in self.dirs.values():
            if is_mounted(d):
                force_unmount(d)


def test_the_readme_examples_run_on_the_sample(tmp_path, legacy_venvs):  # noqa: F811
    run = Run(tmp_path, legacy_venvs)
    ran = 0
    try:
        for _, line in code_lines():
            what = kind(line)
            if what == "command":
                run.command(line)
                ran += 1
            elif what == "fstab":
                run.fstab(line)
                ran += 1
            elif what == "serve":
                run.serve(line)
                ran += 1
    finally:
        run.close()
    print("skipped:\n" + "\n".join(run.skipped))
    assert ran - len(run.skipped) >= 10, run.skipped


def test_the_sample_is_valid_ome_zarr_0_5(legacy_venvs):  # noqa: F811
    """Validated by ome-zarr-models (the OME-Zarr 0.5 schema) and read by ome-zarr-py >= 0.11."""
    code = (
        "import sys, zarr\n"
        "from ome_zarr_models.v05.image import Image\n"
        "from ome_zarr.io import parse_url\n"
        "from ome_zarr.reader import Reader, Multiscales\n"
        "image = Image.from_zarr(zarr.open_group(sys.argv[1] + '/raw', mode='r'))\n"
        "print([d.path for d in image.ome_attributes.multiscales[0].datasets])\n"
        "node = next(iter(Reader(parse_url(sys.argv[1] + '/raw'))()))\n"
        "assert Multiscales.matches(node.zarr), node\n"
        "print([tuple(a.shape) for a in node.data])\n"
    )
    r = subprocess.run([str(legacy_venvs / "ome05" / "bin" / "python"), "-c", code, SAMPLE], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["['0', '1', '2']", "[(32, 64, 64), (16, 32, 32), (8, 16, 16)]"]
