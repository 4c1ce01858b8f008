"""The tools people use on microscopy data, through the Zarr v2 and N5 views of OME-Zarr 0.5.

Fixtures are written by independent OME writers (ngff-zarr, ome-zarr-py >= 0.11) in their own
venv; the mounts are read by an OME-NGFF 0.4 reader (ome-zarr-py 0.9 with zarr-python 2.18
and dask) and by z5py, each in the venv `scripts/setup-legacy` makes, and by tensorstore here.
Everything is compared with what zarr-python 3 reads from the sharded originals, and the N5
multiscale metadata with the conventions derived here from the OME metadata.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import run_zvfs, zvfs_mount

pytestmark = pytest.mark.mount

REPO = Path(__file__).resolve().parents[1]

WRITE_OME_05 = r'''
import sys, numpy as np, zarr
import ngff_zarr as nz
from ome_zarr.writer import write_image, write_labels
from ome_zarr.format import FormatV05

out = sys.argv[1]
rng = np.random.default_rng(7)

# ngff-zarr, zyx, three levels, sharded, with a translation; no labels
data = rng.integers(0, 4000, size=(12, 64, 80), dtype=np.uint16)
img = nz.to_ngff_image(data, dims=["z", "y", "x"], scale={"z": 2.0, "y": 0.5, "x": 0.5},
                       translation={"z": 0.0, "y": 1.0, "x": 2.0},
                       axes_units={"z": "micrometer", "y": "micrometer", "x": "micrometer"}, name="ngff3d")
ms = nz.to_multiscales(img, scale_factors=[{"z": 1, "y": 2, "x": 2}, {"z": 2, "y": 4, "x": 4}], chunks=16)
nz.to_ngff_zarr(f"{out}/ngff-zyx.ome.zarr", ms, version="0.5", chunks_per_shard=2)

# ngff-zarr, tczyx float32, two levels, sharded
data = rng.random(size=(2, 2, 6, 32, 40), dtype=np.float32)
img = nz.to_ngff_image(data, dims=["t", "c", "z", "y", "x"], scale={"t": 1.0, "c": 1.0, "z": 1.0, "y": 0.25, "x": 0.25},
                       axes_units={"t": "second", "z": "nanometer", "y": "nanometer", "x": "nanometer"}, name="ngff5d")
ms = nz.to_multiscales(img, scale_factors=[{"t": 1, "c": 1, "z": 1, "y": 2, "x": 2}], chunks=8)
nz.to_ngff_zarr(f"{out}/ngff-tczyx.ome.zarr", ms, version="0.5", chunks_per_shard=2)

# ome-zarr-py, czyx uint8, omero channels, a label image; sharded
data = rng.integers(0, 255, size=(2, 8, 64, 64), dtype=np.uint8)
root = zarr.open_group(f"{out}/omepy-czyx.ome.zarr", mode="w", zarr_format=3)
omero = {"channels": [{"label": "DAPI", "color": "0000FF", "active": True, "window": {"start": 0, "end": 255, "min": 0, "max": 255}},
                      {"label": "GFP", "color": "00FF00", "active": True, "window": {"start": 0, "end": 255, "min": 0, "max": 255}}]}
write_image(data, root, axes="czyx", fmt=FormatV05(), metadata={"omero": omero},
            storage_options={"chunks": (1, 4, 16, 16), "shards": (1, 8, 32, 32)})
write_labels((data[0] > 128).astype(np.uint32), root, name="cells", axes="zyx", fmt=FormatV05(),
             storage_options={"chunks": (4, 16, 16), "shards": (8, 32, 32)})

# ome-zarr-py, tczyx uint16 with labels of the same rank
data = rng.integers(0, 60000, size=(2, 1, 4, 32, 32), dtype=np.uint16)
root = zarr.open_group(f"{out}/omepy-tczyx.ome.zarr", mode="w", zarr_format=3)
write_image(data, root, axes="tczyx", fmt=FormatV05(), scale_factors=(2,),
            storage_options={"chunks": (1, 1, 2, 16, 16), "shards": (1, 1, 4, 32, 32)})
write_labels((data > 30000).astype(np.uint8), root, name="bright", axes="tczyx", fmt=FormatV05(), scale_factors=(2,),
             storage_options={"chunks": (1, 1, 2, 16, 16), "shards": (1, 1, 4, 32, 32)})
'''

READ_OME_04 = r'''
import json, os, sys, numpy as np
import dask.array as da, zarr
from ome_zarr.io import parse_url
from ome_zarr.reader import Labels, Multiscales, Reader

assert zarr.__version__.startswith("2.18"), zarr.__version__
mnt, out = sys.argv[1], sys.argv[2]
found = []
for node in Reader(parse_url(mnt))():
    attrs = node.zarr.root_attrs
    entry = {"path": os.path.relpath(node.zarr.path, mnt), "specs": [type(s).__name__ for s in node.specs]}
    if any(isinstance(s, Multiscales) for s in node.specs):
        entry.update(multiscales=attrs["multiscales"], omero=attrs.get("omero"), image_label=attrs.get("image-label"),
                     reader=[], zarr2=[])
        for i, level in enumerate(node.data):  # what ome-zarr-py loads (dask over zarr 2.18)
            f = os.path.join(out, f"{len(found)}-reader-{i}.npy")
            np.save(f, np.asarray(level.compute()))
            entry["reader"].append(f)
        for i, ds in enumerate(attrs["multiscales"][0]["datasets"]):  # zarr-python 2.18 + dask by path
            f = os.path.join(out, f"{len(found)}-zarr2-{i}.npy")
            np.save(f, da.from_zarr(zarr.open_array(os.path.join(node.zarr.path, ds["path"]), mode="r")).compute())
            entry["zarr2"].append(f)
    if any(isinstance(s, Labels) for s in node.specs):
        entry["labels"] = attrs["labels"]
    found.append(entry)
with open(os.path.join(out, "found.json"), "w") as f:
    json.dump(found, f)
'''

READ_Z5 = r'''
import json, os, sys, numpy as np, z5py
mnt, group, out = sys.argv[1], sys.argv[2], sys.argv[3]
f = z5py.File(mnt, mode="r")
g = f[group] if group else f
result = {"group": dict(g.attrs), "levels": {}}
for name in sorted(g.keys()):
    if isinstance(g[name], z5py.Dataset):
        path = os.path.join(out, f"z5-{name}.npy")
        np.save(path, g[name][...])
        result["levels"][name] = {"attrs": dict(g[name].attrs), "npy": path}
with open(os.path.join(out, "z5.json"), "w") as fh:
    json.dump(result, fh)
'''


@pytest.fixture(scope="session")
def legacy_venvs() -> Path:
    r = subprocess.run([str(REPO / "scripts" / "setup-legacy")], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.strip().splitlines()[-1])


def run_in(venv: Path, code: str, *args) -> None:
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code, *map(str, args)], capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.fixture(scope="session")
def ome_images(legacy_venvs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ome05")
    run_in(legacy_venvs / "ome05", WRITE_OME_05, out)
    return out


IMAGES = ["ngff-zyx", "ngff-tczyx", "omepy-czyx", "omepy-tczyx"]


def ome_of(path: Path) -> dict:
    """The 0.5 "ome" block of a group, read with zarr-python 3 from the original."""
    import zarr

    return dict(zarr.open_group(str(path), mode="r").attrs)["ome"]


def original_levels(image: Path) -> list[np.ndarray]:
    import zarr

    g = zarr.open_group(str(image), mode="r")
    return [np.asarray(g[d["path"]][...]) for d in ome_of(image)["multiscales"][0]["datasets"]]


def scales_of(ome: dict) -> list[list[float]]:
    return [next(t["scale"] for t in d["coordinateTransformations"] if t["type"] == "scale")
            for d in ome["multiscales"][0]["datasets"]]


@pytest.mark.parametrize("name", IMAGES)
def test_ome04_tools_find_the_image_in_the_zarr2_view(ome_images, legacy_venvs, tmp_path, name):
    src = ome_images / f"{name}.ome.zarr"
    out = tmp_path / "out"
    out.mkdir()
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=("view=zarr2",)) as mnt:
        run_in(legacy_venvs / "ome04", READ_OME_04, mnt, out)
    found = {e["path"]: e for e in json.loads((out / "found.json").read_text())}
    ome = ome_of(src)
    image = found["."]
    assert "Multiscales" in image["specs"]
    ms = image["multiscales"][0]
    assert ms["version"] == "0.4"
    assert ms["axes"] == ome["multiscales"][0]["axes"]
    assert [d["coordinateTransformations"] for d in ms["datasets"]] == \
        [d["coordinateTransformations"] for d in ome["multiscales"][0]["datasets"]]
    assert image["omero"] == ome.get("omero")
    want = original_levels(src)
    assert len(image["reader"]) == len(want) == len(image["zarr2"])
    for i, w in enumerate(want):
        for f in (image["reader"][i], image["zarr2"][i]):
            got = np.load(f)
            assert got.dtype == w.dtype and np.array_equal(got, w), f"{name} level {i} ({f})"
    label_names = ome_of(src / "labels").get("labels", []) if (src / "labels").exists() else []
    if not label_names:
        assert not any("labels" in p for p in found)
        return
    assert found["labels"]["labels"] == label_names
    for label in label_names:
        entry = found[f"labels/{label}"]
        assert "Label" in entry["specs"] and "Multiscales" in entry["specs"]
        assert entry["image_label"]["version"] == "0.4" and entry["multiscales"][0]["version"] == "0.4"
        for got_f, w in zip(entry["reader"], original_levels(src / "labels" / label), strict=True):
            assert np.array_equal(np.load(got_f), w), f"{name} label {label}"


def _n5_conventions(ome: dict) -> tuple[dict, list[dict]]:
    """Group and per-level attributes the N5 multiscale conventions want, derived from the OME
    metadata here (x first)."""
    axes = ome["multiscales"][0]["axes"]
    scales = scales_of(ome)
    short = {"micrometer": "um", "nanometer": "nm", "second": "s"}
    units = [short.get(a.get("unit", ""), a.get("unit", "")) for a in axes]
    space_unit = [u for a, u in zip(axes, units) if a.get("type") == "space"][-1] or "pixel"
    factors = [[int(round(s / s0)) for s, s0 in zip(sc, scales[0])][::-1] for sc in scales]
    group = {"multiScale": True, "scales": factors, "resolution": scales[0][::-1], "axes": [a["name"] for a in axes][::-1],
             "units": units[::-1], "pixelResolution": {"unit": space_unit, "dimensions": scales[0][::-1]}}
    levels = [{"downsamplingFactors": f, "pixelResolution": {"unit": space_unit, "dimensions": sc[::-1]}}
              for f, sc in zip(factors, scales)]
    return group, levels


@pytest.mark.parametrize("name", IMAGES)
def test_n5_view_carries_the_n5_multiscale_conventions(ome_images, legacy_venvs, tmp_path, name):
    import tensorstore as ts

    src = ome_images / f"{name}.ome.zarr"
    out = tmp_path / "out"
    out.mkdir()
    ome = ome_of(src)
    want = original_levels(src)
    with zvfs_mount(src, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=("view=n5",)) as mnt:
        run_in(legacy_venvs / "ome04", READ_Z5, mnt, "", out)
        # levels under their N5 names; groups that held only levels (ngff-zarr's scaleN/) not
        # shown twice; everything else (labels) still there
        others = ["labels"] if (src / "labels").exists() else []
        assert sorted(os.listdir(mnt)) == sorted(["attributes.json", *others, *(f"s{i}" for i in range(len(want)))])
        for i, w in enumerate(want):  # tensorstore's n5 driver opens the levels by their N5 names
            t = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(mnt / f"s{i}")}}).result()
            assert np.array_equal(np.asarray(t.read().result()).T, w), f"tensorstore n5 s{i}"
    z5 = json.loads((out / "z5.json").read_text())
    group, levels = _n5_conventions(ome)
    for key, value in group.items():
        assert z5["group"][key] == value, key
    assert [d["path"] for d in z5["group"]["multiscales"][0]["datasets"]] == [f"s{i}" for i in range(len(want))]
    assert sorted(z5["levels"]) == [f"s{i}" for i in range(len(want))]
    for i, w in enumerate(want):
        level = z5["levels"][f"s{i}"]
        for key, value in levels[i].items():
            assert level["attrs"][key] == value, (i, key)
        got = np.load(level["npy"])  # z5py shows N5 datasets in C order, like the original
        assert got.dtype == w.dtype and np.array_equal(got, w), f"z5py s{i}"


# ------------------------------------------------------------------------- transcoding codecs


CHAINS = {
    "crc32c": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
    "zstd-crc32c": [{"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "zstd", "configuration": {"level": 3, "checksum": False}}, {"name": "crc32c"}],
    "big-crc32c": [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}],
    "transpose-blosc-crc32c": [{"name": "transpose", "configuration": {"order": [1, 0, 2]}},
                               {"name": "bytes", "configuration": {"endian": "little"}},
                               {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 2, "blocksize": 0}},
                               {"name": "crc32c"}],
    "gzip-zstd": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}},
                  {"name": "zstd", "configuration": {"level": 1, "checksum": True}}],
    "numcodecs-lz4": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "numcodecs.lz4", "configuration": {"acceleration": 1}}],
}


@pytest.fixture(scope="module")
def codec_store(tmp_path_factory) -> tuple[Path, dict]:
    """One sharded array per inner codec chain, written by zarr-python 3 (json edited to the
    chain, the data written through it)."""
    import warnings

    import zarr

    root = tmp_path_factory.mktemp("codecs") / "codecs.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    data = {}
    rng = np.random.default_rng(3)
    for name, inner in CHAINS.items():
        meta = {"zarr_format": 3, "node_type": "array", "shape": [10, 12, 7], "data_type": "int16",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8, 7]}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": 0, "codecs": [{"name": "sharding_indexed", "configuration": {
                    "chunk_shape": [4, 4, 7], "codecs": inner,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                    "index_location": "end"}}]}
        (root / name).mkdir()
        (root / name / "zarr.json").write_text(json.dumps(meta))
        data[name] = rng.integers(-30000, 30000, size=(10, 12, 7), dtype=np.int16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.open_array(str(root / name), mode="r+")[...] = data[name]
    del g
    return root, data


@pytest.mark.parametrize("compression", ["raw", "zstd"])
def test_every_chain_zarr_decodes_is_in_the_n5_view(codec_store, tmp_path, compression):
    import tensorstore as ts

    root, data = codec_store
    opts = ("view=n5",) + (() if compression == "raw" else (f"n5_compression={compression}",))
    with zvfs_mount(root, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=opts) as mnt:
        assert sorted(p.name for p in mnt.iterdir() if p.is_dir()) == sorted(CHAINS)
        for name, want in data.items():
            t = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(mnt / name)},
                         "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
            assert np.array_equal(np.asarray(t.read().result()).T, want), name
    assert "Traceback" not in (tmp_path / "zvfs.log").read_text()


# ------------------------------------------------------------------------- roots a view cannot show


def test_a_root_the_view_cannot_show_is_refused(tmp_path):
    """A root array with gzip after sharding (shown as stored by the Zarr view) has neither an
    N5 nor a Zarr v2 form: mount and ls say why, exit 2, nothing is mounted."""
    import zarr

    src = tmp_path / "root.zarr"
    meta = {"zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4], "codecs": [{"name": "bytes"}],
                                                                      "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                                                                      "index_location": "end"}},
                       {"name": "gzip", "configuration": {"level": 1}}]}
    src.mkdir()
    (src / "zarr.json").write_text(json.dumps(meta))
    zarr.open_array(str(src), mode="r+")[...] = np.arange(64, dtype=np.uint8).reshape(8, 8)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for view in ("n5", "zarr2"):
        for args in (("mount", src, mnt, "--view", view), ("ls", src, "--view", view)):
            r = run_zvfs(*args)
            err = r.stderr.decode().strip()
            assert r.returncode == 2, (args, r.returncode, err)
            errors = [line for line in err.splitlines() if line.startswith("zvfs:")]  # (warnings may precede)
            assert len(errors) == 1 and "root array cannot be shown" in errors[0] and "gzip" in errors[0], err
            assert not os.path.ismount(mnt)
    r = run_zvfs("ls", src)  # the Zarr view shows it (as stored)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------- v2 fill values per dtype


NO_EDIT = object()
NAN_TOKEN = object()
DTYPE_FILLS = [  # (v3 data type, fill value, the fill value as an outside writer put it in zarr.json, values)
    ("bool", True, NO_EDIT, [True, False]), ("bool", False, 0, [True, False]),
    ("int8", -3, NO_EDIT, [-128, 127]), ("uint8", 200, NO_EDIT, [0, 255]), ("int16", -300, NO_EDIT, [-1, 2]),
    ("uint16", 65535, NO_EDIT, [0, 1]), ("int32", -7, NO_EDIT, [1, 2]), ("uint32", 7, NO_EDIT, [1, 2]),
    ("int64", -(2**62), NO_EDIT, [1, 2]), ("uint64", 2**63 + 5, NO_EDIT, [1, 2]),
    ("float16", float("nan"), NO_EDIT, [1.5, -2.0]), ("float32", float("inf"), NO_EDIT, [0.25, 1e30]),
    ("float32", float("nan"), NAN_TOKEN, [1.0, 2.0]), ("float64", float("-inf"), NO_EDIT, [1e-300, -5.0]),
    ("float64", 2.5, NO_EDIT, [0.0, 1.0]), ("complex64", complex(1.0, float("nan")), NO_EDIT, [1 + 2j, -3j]),
    ("complex128", complex(0.5, -0.25), NO_EDIT, [1 + 1j, 2]), ("string", "", NO_EDIT, ["ab", "cdé"]),
]


@pytest.fixture(scope="module")
def dtype_store(tmp_path_factory) -> tuple[Path, dict]:
    """One sharded array per data type and fill value, written by zarr-python 3; some fill
    values in zarr.json are then set to the form outside writers use (bool as 0; a bare NaN
    token, as zarrita 0.2.7 writes)."""
    import zarr

    root = tmp_path_factory.mktemp("dtypes") / "dtypes.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=3)
    expect = {}
    for i, (dtype, fill, edit, values) in enumerate(DTYPE_FILLS):
        name = f"a{i}_{dtype}"
        a = zarr.create_array(str(root / name), shape=(6, 5), chunks=(2, 5), shards=(4, 5), dtype=dtype, fill_value=fill,
                              compressors=None, zarr_format=3)
        data = np.full((2, 5), fill, dtype=a.dtype)
        data[:, :2] = np.array(values, dtype=a.dtype)[:, None]  # only the first shard holds chunks
        a[:2, :] = data
        if edit is not NO_EDIT:
            meta_path = root / name / "zarr.json"
            meta = json.loads(meta_path.read_text())
            meta_path.write_text(json.dumps({**meta, "fill_value": float("nan") if edit is NAN_TOKEN else edit}))
        expect[name] = (dtype, np.asarray(zarr.open_array(str(root / name), mode="r")[...]))
    assert "NaN," in "".join(p.read_text() for p in root.glob("*/zarr.json"))  # a bare token is there
    return root, expect


def _strict_json(text: str):
    def bad(token):
        raise ValueError(f"non-JSON token {token}")

    return json.loads(text, parse_constant=bad)


READ_ZARR218 = r'''
import json, os, sys, numpy as np, zarr
assert zarr.__version__.startswith("2.18"), zarr.__version__
mnt, out = sys.argv[1], sys.argv[2]
fills = {}
for name in sorted(os.listdir(mnt)):
    if os.path.isdir(os.path.join(mnt, name)):
        a = zarr.open_array(os.path.join(mnt, name), mode="r")
        np.save(os.path.join(out, name + ".npy"), a[...])
        fills[name] = repr(a.fill_value)
json.dump(fills, open(os.path.join(out, "fills.json"), "w"))
'''


def test_zarr2_metadata_is_valid_for_every_dtype(dtype_store, legacy_venvs, tmp_path):
    import tensorstore as ts

    root, expect = dtype_store
    out = tmp_path / "out"
    out.mkdir()
    with zvfs_mount(root, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=("view=zarr2",)) as mnt:
        for name, (dtype, want) in expect.items():
            zarray = _strict_json((mnt / name / ".zarray").read_text())
            fill = zarray["fill_value"]
            if dtype == "bool":
                assert isinstance(fill, bool), fill
            if want.dtype.kind == "f" and not np.isfinite(want[-1, -1]):
                assert fill in ("NaN", "Infinity", "-Infinity"), fill
            if dtype == "string":  # tensorstore's zarr driver has no object arrays
                assert zarray["dtype"] == "|O" and zarray["filters"] == [{"id": "vlen-utf8"}] and fill == ""
                continue
            t = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(mnt / name)},
                         "context": {"cache_pool": {"total_bytes_limit": 0}}}).result()
            got = np.asarray(t.read().result())
            assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), f"tensorstore {name}"
        run_in(legacy_venvs / "ome04", READ_ZARR218, mnt, out)
    for name, (dtype, want) in expect.items():
        got = np.load(out / f"{name}.npy", allow_pickle=dtype == "string")
        if dtype == "string":
            assert got.dtype == object and got.tolist() == want.tolist(), f"zarr 2.18 {name}"
            continue
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), f"zarr 2.18 {name}"
