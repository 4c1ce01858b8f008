"""Independent reference for the unsharded view of a sharded Zarr v3 store.

Computed from the ORIGINAL store only (never from the mount), straight from the spec:
shard index = (offset, nbytes) uint64 pairs in C order over the inner grid, both 2**64-1 for an
empty inner chunk, at the start or end of the shard object, encoded by the `bytes` index codec
(little or big endian) optionally followed by a crc32c (little-endian uint32 of the CRC-32C of
the index bytes). Nested sharding: the inner chunk bytes are themselves a shard.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import crc32c as _crc32c
import numpy as np

EMPTY = 2**64 - 1


class IndexCorrupt(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# chunk keys


def chunk_key(meta: dict, coords) -> str:
    cke = meta.get("chunk_key_encoding") or {"name": "default"}
    name = cke["name"]
    conf = cke.get("configuration") or {}
    if name == "default":
        sep = conf.get("separator", "/")
        return "c" if len(coords) == 0 else "c" + sep + sep.join(str(int(c)) for c in coords)
    if name == "v2":
        sep = conf.get("separator", ".")
        return "0" if len(coords) == 0 else sep.join(str(int(c)) for c in coords)
    raise ValueError(f"unknown chunk_key_encoding {name}")


# ----------------------------------------------------------------------------------------------
# shard index


def _index_layout(index_codecs: list) -> tuple[str, bool]:
    if not index_codecs or index_codecs[0]["name"] not in ("bytes", "endian"):
        raise ValueError(f"unsupported index codecs {index_codecs}")
    endian = (index_codecs[0].get("configuration") or {}).get("endian", "little")
    rest = [c["name"] for c in index_codecs[1:]]
    if rest not in ([], ["crc32c"]):
        raise ValueError(f"unsupported index codecs {index_codecs}")
    return endian, rest == ["crc32c"]


def decode_index(shard: bytes, n: int, cfg: dict) -> np.ndarray:
    """(n, 2) uint64 array of (offset, nbytes); raises IndexCorrupt on a crc32c mismatch."""
    endian, crc = _index_layout(cfg["index_codecs"])
    size = 16 * n + (4 if crc else 0)
    if len(shard) < size:
        raise IndexCorrupt("shard shorter than its index")
    raw = shard[:size] if cfg.get("index_location", "end") == "start" else shard[len(shard) - size:]
    if crc:
        want = int.from_bytes(raw[-4:], "little")
        if _crc32c.crc32c(raw[:-4]) != want:
            raise IndexCorrupt("crc32c mismatch")
        raw = raw[:-4]
    return np.frombuffer(raw, dtype=(">u8" if endian == "big" else "<u8")).reshape(n, 2).astype(np.uint64)


def _is_sharding(codec: dict) -> bool:
    return codec.get("name") == "sharding_indexed"


def innermost(cfg: dict) -> tuple[tuple, list]:
    """(innermost chunk shape in the codec's input order, innermost codecs)."""
    inner = tuple(cfg["chunk_shape"])
    codecs = cfg["codecs"]
    shard_codecs = [c for c in codecs if _is_sharding(c)]
    if shard_codecs:
        if len(codecs) != 1:
            raise NotImplementedError("reference handles nested sharding only as the sole inner codec")
        return innermost(codecs[0]["configuration"])
    return inner, copy.deepcopy(codecs)


def iter_leaves(shard: bytes, cfg: dict, shard_shape: tuple):
    """Yield (local coords in innermost-chunk units, bytes) for every stored innermost chunk."""
    inner = tuple(cfg["chunk_shape"])
    per = tuple(s // i for s, i in zip(shard_shape, inner))
    n = math.prod(per)
    idx = decode_index(shard, n, cfg)
    codecs = cfg["codecs"]
    nested = codecs[0]["configuration"] if len(codecs) == 1 and _is_sharding(codecs[0]) else None
    for flat in range(n):
        off, nb = int(idx[flat, 0]), int(idx[flat, 1])
        if off == EMPTY and nb == EMPTY:
            continue
        local = np.unravel_index(flat, per) if per else ()
        data = shard[off:off + nb]
        assert len(data) == nb, "index points past the end of the shard"
        if nested is None:
            yield tuple(int(x) for x in local), data
        else:
            leaf, _ = innermost(nested)
            ratio = tuple(i // l for i, l in zip(inner, leaf))
            for sub, b in iter_leaves(data, nested, inner):
                yield tuple(int(l) * r + s for l, r, s in zip(local, ratio, sub)), b


# ----------------------------------------------------------------------------------------------
# arrays


def _perm(codec: dict, ndim: int) -> list[int]:
    order = codec.get("configuration", {}).get("order")
    if order == "C":
        return list(range(ndim))
    if order == "F":
        return list(range(ndim))[::-1]
    return list(order)


def analyse_meta(meta: dict):
    """Return (kind, info): kind is "plain", "unshard" or "as_stored" (with a reason)."""
    codecs = meta.get("codecs", [])
    pos = [i for i, c in enumerate(codecs) if _is_sharding(c)]
    if not pos:
        return "plain", None
    i = pos[0]
    if meta.get("storage_transformers"):
        return "as_stored", "storage transformer"
    if i != len(codecs) - 1:
        return "as_stored", "bytes->bytes codec after sharding_indexed"
    pre = codecs[:i]
    if any(c["name"] != "transpose" for c in pre):
        return "as_stored", "array->array codec other than transpose before sharding"
    ndim = len(meta["shape"])
    P = list(range(ndim))
    for c in pre:  # compose: out[i] = in[p[i]]
        p = _perm(c, ndim)
        P = [P[p[k]] for k in range(ndim)]
    return "unshard", {"pre": copy.deepcopy(pre), "perm": P, "cfg": codecs[i]["configuration"]}


def unsharded_meta(meta: dict) -> dict:
    """The rewritten zarr.json of a sharded array (unchanged if not unshardable)."""
    kind, info = analyse_meta(meta)
    if kind != "unshard":
        return copy.deepcopy(meta)
    leaf_t, leaf_codecs = innermost(info["cfg"])
    P = info["perm"]
    leaf = [0] * len(leaf_t)
    for k, p in enumerate(P):
        leaf[p] = leaf_t[k]
    out = copy.deepcopy(meta)
    out["chunk_grid"]["configuration"]["chunk_shape"] = leaf
    out["codecs"] = info["pre"] + leaf_codecs
    return out


@dataclass
class ExpectedArray:
    path: str  # relative to the store root ("" for a root array)
    meta: dict  # original zarr.json
    kind: str  # "plain" | "unshard" | "as_stored"
    reason: str | None
    files: dict[str, bytes]  # chunk/other files relative to the array dir (not zarr.json)
    expected_meta: dict  # what the mounted zarr.json must parse to
    shard_keys: list[str] = field(default_factory=list)  # shard objects present in the original
    corrupt_shards: list[str] = field(default_factory=list)
    shard_of: dict[str, str] = field(default_factory=dict)  # leaf key -> shard key
    original_zarr_json: bytes = b""

    @property
    def dirs(self) -> set[str]:
        out = set()
        for k in self.files:
            parts = k.split("/")[:-1]
            for j in range(1, len(parts) + 1):
                out.add("/".join(parts[:j]))
        return out


def _list_files(d: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for fn in filenames:
            p = Path(dirpath) / fn
            rel = p.relative_to(d).as_posix()
            if rel == "zarr.json":
                continue
            out[rel] = p.read_bytes()
        # do not descend into child nodes (arrays or groups inside an array dir are not a thing,
        # but keep it safe)
        dirnames[:] = [x for x in dirnames if not (Path(dirpath) / x / "zarr.json").exists()]
    return out


def expected_array(store: Path, path: str) -> ExpectedArray:
    adir = store / path if path else store
    raw = (adir / "zarr.json").read_bytes()
    meta = json.loads(raw)
    kind, info = analyse_meta(meta)
    stored = _list_files(adir)
    if kind != "unshard":
        return ExpectedArray(path, meta, kind, info if kind == "as_stored" else None, stored,
                             copy.deepcopy(meta),
                             shard_keys=sorted(stored) if kind == "as_stored" else [],
                             original_zarr_json=raw)
    shape = tuple(meta["shape"])
    shard_shape = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
    P = info["perm"]
    cfg = info["cfg"]
    shard_t = tuple(shard_shape[P[k]] for k in range(len(P)))
    umeta = unsharded_meta(meta)
    leaf = tuple(umeta["chunk_grid"]["configuration"]["chunk_shape"])
    leaf_grid = tuple(math.ceil(s / l) for s, l in zip(shape, leaf))
    ratio = tuple(s // l for s, l in zip(shard_shape, leaf))
    shard_grid = tuple(math.ceil(s / c) for s, c in zip(shape, shard_shape))
    files, shard_keys, corrupt, shard_of = {}, [], [], {}
    for sc in product(*[range(g) for g in shard_grid]):
        sk = chunk_key(meta, sc)
        p = adir / sk
        if not p.is_file():
            continue
        shard_keys.append(sk)
        buf = p.read_bytes()
        try:
            leaves = list(iter_leaves(buf, cfg, shard_t))
        except IndexCorrupt:
            corrupt.append(sk)
            continue
        for local_t, b in leaves:
            local = [0] * len(local_t)
            for k, pk in enumerate(P):
                local[pk] = local_t[k]
            g = tuple(s * r + l for s, r, l in zip(sc, ratio, local))
            if any(x >= n for x, n in zip(g, leaf_grid)):
                continue
            key = chunk_key(meta, g)
            files[key] = b
            shard_of[key] = sk
    return ExpectedArray(path, meta, kind, None, files, umeta, shard_keys=shard_keys,
                         corrupt_shards=corrupt, shard_of=shard_of, original_zarr_json=raw)


def expected_group_meta(meta: dict) -> dict:
    out = copy.deepcopy(meta)
    cm = out.get("consolidated_metadata")
    if cm and isinstance(cm.get("metadata"), dict):
        for k, m in cm["metadata"].items():
            if m.get("node_type") == "array":
                cm["metadata"][k] = unsharded_meta(m)
    return out


@dataclass
class ExpectedStore:
    root: Path
    arrays: dict[str, ExpectedArray]
    groups: dict[str, dict]  # path -> original group zarr.json
    other_files: dict[str, bytes]  # non-node files outside arrays, relative to the root

    def tree(self) -> dict[str, object]:
        """Every file of the mounted tree: relpath -> bytes, or dict for rewritten JSON."""
        out: dict[str, object] = {}
        for gp, meta in self.groups.items():
            key = f"{gp}/zarr.json" if gp else "zarr.json"
            # groups: compared as JSON (attributes identical; consolidated entries rewritten)
            out[key] = expected_group_meta(meta)
        for ap, a in self.arrays.items():
            pre = f"{ap}/" if ap else ""
            out[pre + "zarr.json"] = a.expected_meta if a.kind == "unshard" else a.original_zarr_json
            for k, b in a.files.items():
                out[pre + k] = b
        out.update(self.other_files)
        return out

    def dirs(self) -> set[str]:
        out = {""}
        for f in self.tree():
            parts = f.split("/")[:-1]
            for j in range(1, len(parts) + 1):
                out.add("/".join(parts[:j]))
        return out

    def listing(self, d: str) -> list[str]:
        """Expected sorted names in directory d (relative to the root)."""
        d = d.strip("/")
        names = set()
        dirs = self.dirs()
        for f in list(self.tree()) + list(dirs):
            if f == "":
                continue
            parent, _, name = f.rpartition("/")
            if parent == d:
                names.add(name)
        return sorted(names)


def expected_store(root: str | os.PathLike) -> ExpectedStore:
    root = Path(root)
    arrays, groups, other = {}, {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        rel = d.relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        if "zarr.json" in filenames:
            meta = json.loads((d / "zarr.json").read_bytes())
            if meta.get("node_type") == "array":
                arrays[rel] = expected_array(root, rel)
                dirnames[:] = []
                continue
            groups[rel] = meta
        for fn in filenames:
            if fn != "zarr.json":
                other[f"{rel}/{fn}" if rel else fn] = (d / fn).read_bytes()
    return ExpectedStore(root, arrays, groups, other)
