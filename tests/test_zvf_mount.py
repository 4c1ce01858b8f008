"""ZVF (zarr-vectors) stores through real zvfs mounts.

Writer and reader are zarr-vectors, independent of zvfs. Every case is written twice by
zarr-vectors (tests/writers_zvf.py): sharded, and unsharded (the twin) with the same data, under
the same store basename. Expected values come only from the twin or from zarr-vectors reading
the sharded original, never from the mount:

1. the mounted sharded store is the twin, byte for byte (arrays' zarr.json and chunk files);
   group metadata is the original's;
2. listings come from the shard indexes, not from the `nonempty_chunks` attribute, which passes
   through unchanged; object_index/ and object_attributes/ pass through;
3. zarr-vectors' readers and validator give on the mount what they give on the original;
4. `<level>/objects/<oid>.npy` holds each object's vertex rows (what zarr-vectors returns for it);
5. `zvfs inspect --json` has a "zvf" section (geometry types, levels, objects, sharded arrays).

Every store is written and mounted once per session.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import writers_zvf as W  # noqa: E402
from conftest import run_zvfs, zvfs_mount  # noqa: E402

warnings.filterwarnings("ignore", module="zarr")
pytestmark = pytest.mark.mount

OBJECTS = "objects"
META = "zarr.json"

ALL = list(W.CASES)
#: cases whose objects/ directory can be listed quickly (not 17000 entries)
LISTABLE = [c for c in ALL if not W.INFOS[c].many_objects]
WITH_OBJECTS = [c for c in LISTABLE if W.INFOS[c].has_objects]
CASE_LEVELS = [(c, lv) for c in ALL for lv in W.INFOS[c].levels]
OBJECT_LEVELS = [(c, lv) for c in WITH_OBJECTS for lv in W.INFOS[c].levels]
SPARSIFIED = [(c, lv) for c in WITH_OBJECTS for lv in W.INFOS[c].sparsified_levels]


def _id(v):
    return f"{v[0]}-L{v[1]}" if isinstance(v, tuple) else str(v)


# ----------------------------------------------------------------------------------------------
# session stores and mounts


class ZvfStores:
    def __init__(self, factory, stack: contextlib.ExitStack):
        self.factory = factory
        self.stack = stack
        self._pairs: dict[str, tuple[Path, Path]] = {}
        self._mounts: dict[str, Path] = {}
        self._failed: dict[str, str] = {}
        self._levels: dict = {}
        self._trees: dict = {}
        self._ids: dict = {}
        self._objects: dict = {}

    def pair(self, name: str) -> tuple[Path, Path]:
        """(sharded original, unsharded twin): same basename, different parents."""
        if name not in self._pairs:
            orig, _ = W.write_case(name, self.factory.mktemp(f"zvf-orig-{name}"), sharded=True)
            twin, _ = W.write_case(name, self.factory.mktemp(f"zvf-twin-{name}"), sharded=False)
            assert orig.name == twin.name
            sharded = sharded_arrays(orig)
            assert sharded, f"{name}: zarr-vectors wrote no sharded array; the case tests nothing"
            assert not sharded_arrays(twin), f"{name}: the twin has sharded arrays"
            self._pairs[name] = (orig, twin)
        return self._pairs[name]

    def orig(self, name: str) -> Path:
        return self.pair(name)[0]

    def twin(self, name: str) -> Path:
        return self.pair(name)[1]

    def mount(self, key: str, src: Path | None = None) -> Path:
        if key in self._failed:
            pytest.fail(f"mount of {key} failed earlier in this session: {self._failed[key]}")
        if key not in self._mounts:
            src = self.orig(key) if src is None else src
            base = self.factory.mktemp(f"zvf-mnt-{key}")
            try:
                self._mounts[key] = self.stack.enter_context(zvfs_mount(src, base / "mnt", log=base / "zvfs.log"))
            except BaseException as e:
                self._failed[key] = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise
        return self._mounts[key]

    def mount_tree(self, key: str):
        """(virtual objects/ dirs, {path: bytes}, {path: st_size}) of a mount, walked once."""
        if key not in self._trees:
            mnt = self.mount(key)
            twin = self.twin(NONEMPTY_CASE if key == "nonempty-edited" else key)
            virtual = virtual_object_dirs(mnt, twin)
            self._trees[key] = (virtual, *read_tree(mnt, virtual))
        return self._trees[key]

    def log_tail(self, key: str) -> str:
        log = self._mounts[key].parent / "zvfs.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def _level(self, name: str, level: int):
        from zarr_vectors.core.arrays import vertices_dtype
        from zarr_vectors.core.store import get_resolution_level, open_store, read_root_metadata

        if (name, level) not in self._levels:
            root = open_store(str(self.orig(name)))
            group = get_resolution_level(root, level)
            self._levels[name, level] = (group, vertices_dtype(group), read_root_metadata(root).sid_ndim, root)
        return self._levels[name, level]

    def object_ids(self, name: str, level: int) -> tuple[list[int], list[int]]:
        """(every object id of LEVEL, the ids with a non-empty manifest), from zarr-vectors'
        read_object_manifest_rows on the sharded original."""
        from zarr_vectors.core.arrays import read_object_manifest_rows

        if (name, level) not in self._ids:
            ids, manifests = read_object_manifest_rows(self._level(name, level)[0])
            self._ids[name, level] = ([int(i) for i in ids], sorted(int(i) for i, m in zip(ids, manifests) if len(m)))
        return self._ids[name, level]

    def expected_object(self, name: str, level: int, oid: int) -> np.ndarray | None:
        """An object's vertex rows as zarr-vectors reads them from the sharded original
        (read_object_vertices, concatenated); None for an empty manifest."""
        from zarr_vectors.core.arrays import read_object_vertices

        key = (name, level, oid)
        if key not in self._objects:
            group, dtype, ndim, _ = self._level(name, level)
            parts = read_object_vertices(group, oid, dtype=dtype, ndim=ndim)
            self._objects[key] = np.concatenate(parts, axis=0) if parts else None
        return self._objects[key]

    def expected_objects(self, name: str, level: int) -> dict[int, np.ndarray]:
        """{oid: vertex rows} for every object of LEVEL with a non-empty manifest."""
        out = {}
        with self._level(name, level)[3].cached_nodes():
            for oid in self.object_ids(name, level)[0]:
                rows = self.expected_object(name, level, oid)
                if rows is not None:
                    out[oid] = rows
        return out


@pytest.fixture(scope="session")
def zvf(tmp_path_factory, no_mounts_left_behind):
    with contextlib.ExitStack() as stack:
        yield ZvfStores(tmp_path_factory, stack)


# ----------------------------------------------------------------------------------------------
# helpers


def sharded_arrays(root: Path) -> list[str]:
    """Paths of the arrays whose stored zarr.json uses sharding_indexed (read from the files)."""
    out = []
    for d, _, files in os.walk(root):
        if META in files:
            m = json.loads((Path(d) / META).read_bytes())
            if m.get("node_type") == "array" and any(
                    isinstance(c, dict) and c.get("name") == "sharding_indexed" for c in m.get("codecs", [])):
                out.append(Path(d).relative_to(root).as_posix())
    return sorted(out)


def object_levels(root: Path) -> set[str]:
    """Level groups of a store (as stored) that have an object_index/."""
    out = set()
    for d, _, files in os.walk(root):
        if META in files and Path(d).name == "object_index":
            out.add(Path(d).parent.relative_to(root).as_posix())
    return out


def read_tree(root: Path, skip_dirs: set[str] = frozenset()) -> tuple[dict[str, bytes], dict[str, int]]:
    """{relative path: bytes} and {relative path: st_size} of every file below ROOT; relative
    directory paths in SKIP_DIRS are not entered."""
    data, sizes = {}, {}
    for d, dirs, files in os.walk(root):
        rel_d = Path(d).relative_to(root)
        dirs[:] = [x for x in dirs if (rel_d / x).as_posix() not in skip_dirs]
        for f in files:
            p = Path(d) / f
            rel = (rel_d / f).as_posix()
            sizes[rel] = os.stat(p).st_size
            data[rel] = p.read_bytes()
    return data, sizes


def virtual_object_dirs(mnt: Path, twin: Path) -> set[str]:
    """Directories named objects/ in the mount that the twin does not have."""
    out = set()
    for d, dirs, _ in os.walk(mnt):
        rel_d = Path(d).relative_to(mnt)
        if OBJECTS in dirs and not (twin / rel_d / OBJECTS).exists():
            out.add((rel_d / OBJECTS).as_posix())
            dirs.remove(OBJECTS)
    return out


def expected_tree(orig: Path, twin: Path) -> dict[str, bytes]:
    """The twin's files, except group zarr.json, which is the sharded original's."""
    want, _ = read_tree(twin)
    for rel in list(want):
        if rel == META or rel.endswith("/" + META):
            o = orig / rel
            if o.exists() and json.loads(o.read_bytes()).get("node_type") == "group":
                want[rel] = o.read_bytes()
    return want


def compare_trees(got: dict[str, bytes], sizes: dict[str, int], want: dict[str, bytes], what: str) -> None:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    bad_size = sorted(k for k in got if sizes[k] != len(got[k]))
    problems = []
    if missing:
        problems.append(f"{len(missing)} files missing from the mount, e.g. {missing[:6]}")
    if extra:
        problems.append(f"{len(extra)} files only in the mount, e.g. {extra[:6]}")
    if differ:
        problems.append(f"{len(differ)} files differ, e.g. {differ[:6]}")
    if bad_size:
        problems.append(f"{len(bad_size)} files whose st_size is not their length, e.g. {bad_size[:6]}")
    assert not problems, f"{what}: " + "; ".join(problems)


def assert_same(a, b, path="result"):
    """Deep equality of zarr-vectors results (dicts, lists, arrays with dtype and shape)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b) if isinstance(b, dict) else type(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: length {len(a)} != {len(b) if isinstance(b, (list, tuple)) else type(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: {type(b)} is not an ndarray"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f"{path}: values differ"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def load_npy(p: Path) -> np.ndarray:
    return np.load(p, allow_pickle=False)


def read_level(geometry: str, store: Path, level: int):
    from zarr_vectors.types.graphs import read_graph
    from zarr_vectors.types.lines import read_lines
    from zarr_vectors.types.meshes import read_mesh
    from zarr_vectors.types.points import read_points
    from zarr_vectors.types.polylines import read_polylines

    if geometry == "points":
        attrs = store / str(level) / "vertex_attributes"
        names = sorted(p.name for p in attrs.iterdir() if p.is_dir()) if attrs.is_dir() else None
        return read_points(str(store), level=level, attribute_names=names)
    return {"lines": read_lines, "polylines": read_polylines, "graph": read_graph, "skeleton": read_graph,
            "mesh": read_mesh}[geometry](str(store), level=level)


def read_one_object(geometry: str, store: Path, level: int, oid: int) -> np.ndarray | None:
    """An object's vertex rows from zarr-vectors' geometry reader (where it filters by id)."""
    if geometry == "polylines":
        from zarr_vectors.types.polylines import read_polylines

        r = read_polylines(str(store), level=level, object_ids=[oid])
        return np.concatenate(r["polylines"][0], axis=0) if r["polylines"] else None
    if geometry == "points":
        from zarr_vectors.types.points import read_points

        return read_points(str(store), level=level, object_ids=[oid])["positions"]
    if geometry == "lines":
        from zarr_vectors.types.lines import read_lines

        e = read_lines(str(store), level=level, object_ids=[oid])["endpoints"]
        return e.reshape(-1, e.shape[-1])
    return None  # read_graph / read_mesh do not implement object_ids=


# ----------------------------------------------------------------------------------------------
# 1. the mount is the unsharded twin


@pytest.mark.parametrize("name", ALL)
def test_tree_equals_unsharded_twin(zvf, name):
    orig, twin = zvf.pair(name)
    zvf.mount(name)
    assert not any(OBJECTS in dirs for _, dirs, _ in os.walk(twin)), "the twin itself has objects/ directories"
    _, got, sizes = zvf.mount_tree(name)
    compare_trees(got, sizes, expected_tree(orig, twin), f"{name}: mount vs unsharded twin")


@pytest.mark.parametrize("name", ALL)
def test_group_metadata_is_the_originals(zvf, name):
    orig = zvf.orig(name)
    mnt = zvf.mount(name)
    groups = [Path(d).relative_to(orig) / META for d, _, files in os.walk(orig)
              if META in files and json.loads((Path(d) / META).read_bytes()).get("node_type") == "group"]
    assert len(groups) >= 2
    for rel in groups:
        assert (mnt / rel).read_bytes() == (orig / rel).read_bytes(), f"{rel} is not the original's"


@pytest.mark.parametrize("name", ALL)
def test_objects_dirs_only_at_object_levels(zvf, name):
    want = {f"{lv}/{OBJECTS}" for lv in object_levels(zvf.orig(name))}
    assert zvf.mount_tree(name)[0] == want


# ----------------------------------------------------------------------------------------------
# 2. listings from shard indexes; pass-through of nonempty_chunks, object_index/, object_attributes/

NONEMPTY_CASE = "polylines"


def _edit_nonempty(meta: dict, how: str, absent_chunk: str | None) -> dict:
    attrs = meta["attributes"]
    if how == "drop":
        del attrs["nonempty_chunks"]
    elif how == "thin":  # keep every third entry, and claim a chunk that is not there
        attrs["nonempty_chunks"] = attrs["nonempty_chunks"][::3] + ([absent_chunk] if absent_chunk else [])
    elif how == "half":
        attrs["nonempty_chunks"] = attrs["nonempty_chunks"][len(attrs["nonempty_chunks"]) // 2:]
    return meta


@pytest.fixture(scope="session")
def nonempty_edited(zvf, tmp_path_factory):
    """A copy of a sharded store with truncated / missing `nonempty_chunks` attributes; returns
    (copy, mount, {array path: expected mounted zarr.json bytes}, twin)."""
    orig, twin = zvf.pair(NONEMPTY_CASE)
    copy = tmp_path_factory.mktemp("zvf-nonempty") / orig.name
    shutil.copytree(orig, copy)
    sharded = sharded_arrays(orig)
    links = [a for a in sharded if "/links/" in a]
    biggest_links = max(links, key=lambda a: len(json.loads((orig / a / META).read_bytes())["attributes"]["nonempty_chunks"]))
    plan = {"0/vertices": "thin", "0/vertex_fragments": "drop", biggest_links: "half"}
    expected = {}
    for array, how in plan.items():
        assert array in sharded
        raw = (copy / array / META).read_bytes()
        assert json.dumps(json.loads(raw), indent=2).encode() == raw, "zarr-vectors no longer writes json.dumps(indent=2)"
        meta = json.loads(raw)
        listed = meta["attributes"]["nonempty_chunks"]
        grid = meta["shape"]
        absent = next((".".join(map(str, c)) for c in np.ndindex(*grid) if ".".join(map(str, c)) not in listed), None)
        assert len(listed) >= 4
        (copy / array / META).write_bytes(json.dumps(_edit_nonempty(meta, how, absent), indent=2).encode())
        # expected: the twin's zarr.json with the same edit (the attribute passes through as edited)
        tmeta = json.loads((twin / array / META).read_bytes())
        expected[array] = json.dumps(_edit_nonempty(tmeta, how, absent), indent=2).encode()
    mnt = zvf.mount("nonempty-edited", copy)
    return copy, mnt, expected, twin


def test_listing_ignores_incomplete_nonempty_chunks(zvf, nonempty_edited):
    copy, mnt, expected, twin = nonempty_edited
    want = expected_tree(copy, twin)
    for array, meta in expected.items():
        want[f"{array}/{META}"] = meta
    _, got, sizes = zvf.mount_tree("nonempty-edited")
    compare_trees(got, sizes, want, "store with edited nonempty_chunks: mount vs twin")


def test_nonempty_chunks_attribute_passes_through(nonempty_edited):
    copy, mnt, expected, _ = nonempty_edited
    for array, meta in expected.items():
        got = json.loads((mnt / array / META).read_bytes())
        want = json.loads(meta)
        assert got["attributes"].get("nonempty_chunks") == want["attributes"].get("nonempty_chunks"), array
        assert (mnt / array / META).read_bytes() == meta, array


def test_lookup_of_unlisted_chunk(nonempty_edited):
    """A chunk present in the shard but missing from nonempty_chunks opens by name."""
    copy, mnt, expected, twin = nonempty_edited
    meta = json.loads(expected["0/vertices"])
    listed = set(meta["attributes"]["nonempty_chunks"])
    for d, _, files in os.walk(twin / "0" / "vertices" / "c"):
        for f in files:
            rel = (Path(d) / f).relative_to(twin)
            key = ".".join(rel.parts[3:])
            if key not in listed:
                assert (mnt / rel).read_bytes() == (twin / rel).read_bytes(), rel
                return
    pytest.fail("the edit left no unlisted chunk")


@pytest.mark.parametrize("name", WITH_OBJECTS)
def test_object_index_and_attributes_pass_through(zvf, name):
    orig = zvf.orig(name)
    mnt = zvf.mount(name)
    seen = 0
    for lv in W.INFOS[name].levels:
        for sub in ("object_index", "object_attributes"):
            if not (orig / str(lv) / sub).exists():
                continue
            want, _ = read_tree(orig / str(lv) / sub)
            got, sizes = read_tree(mnt / str(lv) / sub)
            compare_trees(got, sizes, want, f"{name}: {lv}/{sub}")
            seen += 1
    assert seen


# ----------------------------------------------------------------------------------------------
# 3. zarr-vectors reads the mount as it reads the original


@pytest.mark.parametrize("case_level", CASE_LEVELS, ids=_id)
def test_zarr_vectors_reads_mount_like_original(zvf, case_level):
    name, level = case_level
    geometry = W.INFOS[name].geometry
    orig = zvf.orig(name)
    mnt = zvf.mount(name)
    want = read_level(geometry, orig, level)
    got = read_level(geometry, mnt, level)
    assert_same(want, got)


#: one case per geometry, plus pyramids, chunk_by_attribute, negative bounds, compression
VALIDATED = ["points_oids", "lines", "polylines", "graph", "skeleton", "mesh", "zstd_polylines", "negative",
             "by_attribute", "pyramid", "pyramid_resharded", "points_pyramid"]


@pytest.mark.parametrize("name", VALIDATED)
def test_zarr_vectors_validator_passes_on_mount(zvf, name):
    from zarr_vectors.validate import validate

    mnt = zvf.mount(name)
    got = validate(str(mnt), level=5)
    if not got.ok:
        want = validate(str(zvf.orig(name)), level=5)
        pytest.fail(f"validate(mount, level=5) failed: {[str(e) for e in got.errors][:5]}; "
                    f"on the original: ok={want.ok} {[str(e) for e in want.errors][:5]}")


# ----------------------------------------------------------------------------------------------
# 4. objects/<oid>.npy


@pytest.mark.parametrize("case_level", OBJECT_LEVELS, ids=_id)
def test_objects_listing(zvf, case_level):
    name, level = case_level
    mnt = zvf.mount(name)
    ids, nonempty = zvf.object_ids(name, level)
    assert set(zvf.expected_objects(name, level)) == set(nonempty)  # the two zarr-vectors views agree
    want = sorted(f"{oid}.npy" for oid in nonempty)
    assert want
    got = sorted(os.listdir(mnt / str(level) / OBJECTS))
    assert got == want


@pytest.mark.parametrize("case_level", OBJECT_LEVELS, ids=_id)
def test_objects_content(zvf, case_level):
    name, level = case_level
    mnt = zvf.mount(name)
    bad = []
    for oid, want in zvf.expected_objects(name, level).items():
        p = mnt / str(level) / OBJECTS / f"{oid}.npy"
        raw = p.read_bytes()
        st = os.stat(p)
        got = np.load(io.BytesIO(raw), allow_pickle=False)
        if st.st_size != len(raw):
            bad.append(f"{oid}: st_size {st.st_size} != {len(raw)} bytes read")
        elif (got.dtype, got.shape) != (want.dtype, want.shape) or not np.array_equal(got, want):
            bad.append(f"{oid}: {got.dtype}{got.shape} != {want.dtype}{want.shape} or values differ")
    assert not bad, f"{len(bad)} objects wrong: {bad[:5]}"


@pytest.mark.parametrize("case_level", [cl for cl in OBJECT_LEVELS if W.INFOS[cl[0]].geometry in ("points", "lines", "polylines")], ids=_id)
def test_objects_equal_geometry_reader(zvf, case_level):
    """Second opinion: the geometry's own reader filtered by object id."""
    name, level = case_level
    geometry = W.INFOS[name].geometry
    orig = zvf.orig(name)
    mnt = zvf.mount(name)
    bad = []
    nonempty = zvf.object_ids(name, level)[1]
    for oid in nonempty[:: max(1, len(nonempty) // 12)]:  # a sample: each read scans the level
        want = read_one_object(geometry, orig, level, oid)
        got = load_npy(mnt / str(level) / OBJECTS / f"{oid}.npy")
        if want is None or (got.dtype, got.shape) != (want.dtype, want.shape) or not np.array_equal(got, want):
            bad.append(oid)
    assert not bad, f"objects differing from {geometry} reader: {bad[:10]}"


@pytest.mark.parametrize("name", ["polylines", "long_streamline", "float64_points", "two_d"])
def test_objects_are_numpy_save_bytes(zvf, name):
    mnt = zvf.mount(name)
    for oid, want in zvf.expected_objects(name, 0).items():
        assert (mnt / "0" / OBJECTS / f"{oid}.npy").read_bytes() == npy_bytes(want), oid


def test_large_object_partial_reads(zvf):
    name = "long_streamline"
    mnt = zvf.mount(name)
    objs = zvf.expected_objects(name, 0)
    oid, arr = max(objs.items(), key=lambda kv: len(kv[1]))
    want = npy_bytes(arr)
    assert len(want) > 2 * 128 * 1024
    p = mnt / "0" / OBJECTS / f"{oid}.npy"
    assert os.stat(p).st_size == len(want)
    fd = os.open(p, os.O_RDONLY)
    try:
        for off, n in [(0, 10), (100, 1), (128 * 1024 - 3, 7), (len(want) - 5, 100), (len(want), 10),
                       (len(want) + 1000, 10), (200_000, 150_000), (1, len(want))]:
            assert os.pread(fd, n, off) == want[off:off + n], (off, n)
    finally:
        os.close(fd)


@pytest.mark.parametrize("case_level", SPARSIFIED, ids=_id)
def test_dropped_objects_are_absent(zvf, case_level):
    """Ids dropped at an ID-preserving sparsified level have empty manifests: no file."""
    from zarr_vectors.core.store import open_store, read_level_metadata

    name, level = case_level
    orig = zvf.orig(name)
    mnt = zvf.mount(name)
    assert read_level_metadata(open_store(str(orig)), level).preserves_object_ids
    ids = set(zvf.object_ids(name, level)[0])
    assert ids == set(zvf.object_ids(name, level - 1)[0]), "an ID-preserving level keeps the parent's ids"
    present = set(zvf.expected_objects(name, level))
    assert present == set(zvf.object_ids(name, level)[1])
    dropped = sorted(ids - present)
    assert dropped and present, "the writer built no ID-preserving sparsified level with dropped ids"
    objdir = mnt / str(level) / OBJECTS
    for oid in dropped:
        with pytest.raises(FileNotFoundError):
            os.stat(objdir / f"{oid}.npy")
        with pytest.raises(FileNotFoundError):
            open(objdir / f"{oid}.npy", "rb")
    for oid in sorted(present)[:3]:
        assert os.stat(objdir / f"{oid}.npy").st_size > 0


@pytest.mark.parametrize("name", ["polylines", "sparse_ids", "pyramid"])
def test_objects_bad_names_enoent(zvf, name):
    mnt = zvf.mount(name)
    ids = set(zvf.expected_objects(name, 0))
    some = min(ids)
    names = ["abc.npy", f"0{some}.npy", f"+{some}.npy", f"{some}", f"{some}.npz", f"{some}.npy.tmp", f" {some}.npy",
             f"{max(ids) + 1}.npy", "-1.npy", f"{some}.NPY", ".npy", "99999999999999999999999.npy"]
    names += [f"{i}.npy" for i in range(max(ids) + 2) if i not in ids][:5]
    for n in names:
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / "0" / OBJECTS / n)


def test_sparse_object_ids(zvf):
    """Ids are named by the object_ids table, not by manifest rows."""
    assert set(zvf.expected_objects("sparse_ids", 0)) == {3, 5, 10, 99, 1000}


@pytest.mark.parametrize("name", ["polylines", "pyramid", "mesh"])
def test_objects_cp(zvf, name, tmp_path):
    mnt = zvf.mount(name)
    objs = zvf.expected_objects(name, 0)
    oid = sorted(objs)[len(objs) // 2]
    r = subprocess.run(["cp", str(mnt / "0" / OBJECTS / f"{oid}.npy"), "."], cwd=tmp_path, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = load_npy(tmp_path / f"{oid}.npy")
    assert got.dtype == objs[oid].dtype and np.array_equal(got, objs[oid])


def test_objects_read_only(zvf):
    mnt = zvf.mount("polylines")
    oid = min(zvf.expected_objects("polylines", 0))
    p = mnt / "0" / OBJECTS / f"{oid}.npy"
    st = os.stat(p)
    import stat as stat_mod

    assert stat_mod.S_ISREG(st.st_mode)
    assert stat_mod.S_ISDIR(os.stat(mnt / "0" / OBJECTS).st_mode)
    with pytest.raises(OSError):
        open(p, "r+b")
    with pytest.raises(OSError):
        (mnt / "0" / OBJECTS / "new.npy").write_bytes(b"x")


# -- 17000 objects: object_index/manifests spans two chunks


MANY = "many_objects"


def test_many_objects_lookup_across_manifest_chunks(zvf):
    mnt = zvf.mount(MANY)
    ids, nonempty = zvf.object_ids(MANY, 0)
    assert ids == nonempty == list(range(17000))
    for oid in (0, 1, 16383, 16384, 16385, 16999):
        want = zvf.expected_object(MANY, 0, oid)
        p = mnt / "0" / OBJECTS / f"{oid}.npy"
        raw = p.read_bytes()
        assert os.stat(p).st_size == len(raw)
        got = np.load(io.BytesIO(raw), allow_pickle=False)
        assert got.dtype == want.dtype and np.array_equal(got, want), oid
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "0" / OBJECTS / "17000.npy")


MANY_LISTING_BUDGET = 20.0


def test_many_objects_listing(zvf):
    """`ls -l objects/` over 17000 objects: every name, in reasonable time (a listing is a
    readdirplus, so every entry's size is asked for)."""
    mnt = zvf.mount(MANY)
    want = {f"{oid}.npy" for oid in zvf.object_ids(MANY, 0)[1]}
    t0 = time.monotonic()
    try:
        r = subprocess.run(["ls", "-l", str(mnt / "0" / OBJECTS)], capture_output=True, timeout=MANY_LISTING_BUDGET)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ls -l of objects/ with 17000 entries took more than {MANY_LISTING_BUDGET:.0f} s")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    got = {line.split()[-1] for line in r.stdout.decode().splitlines() if line.endswith(".npy")}
    assert got == want, f"{len(want - got)} missing, {len(got - want)} extra"
    assert elapsed < MANY_LISTING_BUDGET


# ----------------------------------------------------------------------------------------------
# 5. zvfs inspect --json: ZVF section


@pytest.mark.parametrize("name", ["pyramid", "pyramid_resharded", "points_oids"])
def test_inspect_json_zvf_section(zvf, name):
    from zarr_vectors.core.store import open_store, read_root_metadata

    orig = zvf.orig(name)
    r = run_zvfs("inspect", orig, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "zvf" in doc, f"no 'zvf' key in inspect --json (keys: {sorted(doc)})"
    z = doc["zvf"]
    root = open_store(str(orig))
    assert list(z["geometry_types"]) == list(read_root_metadata(root).geometry_types)
    levels = {str(lv["path"]): lv for lv in z["levels"]}
    assert set(levels) == {str(lv) for lv in W.INFOS[name].levels}
    for lv in W.INFOS[name].levels:
        rows, nonempty = map(len, zvf.object_ids(name, lv))
        # "objects": the manifest rows, or the objects with a non-empty manifest (objects/ files)
        assert levels[str(lv)]["objects"] in (rows, nonempty), (lv, levels[str(lv)], rows, nonempty)
    got = sorted(a["path"] if isinstance(a, dict) else a for a in z["sharded_arrays"])
    assert got == sharded_arrays(orig)
