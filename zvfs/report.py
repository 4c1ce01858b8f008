"""`zvfs inspect`: what a store holds and how zvfs will show it.

Counts come from the shard indexes (the same ones the mount uses), so `chunks_present` is the
number of chunk files a mount lists. Each store kind names its sections in its registry entry
(kinds.py); `SECTIONS` says how each is gathered and shown. What the chosen view leaves out
(arrays it cannot express, parts with no array form) is listed with the reason.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Awaitable, Callable, NamedTuple

from .core.kinds import KINDS
from .errors import CorruptShardError, ShardChanged, StorageError
from .formats import precomputed, zvf
from .formats.zarr3 import EMPTY, META, ArrayNode, ShardedArray, child_path
from .storage.base import Store

if TYPE_CHECKING:
    from .core.source import OpenSource

#: what one damaged shard raises; inspect lists it in its array's section and goes on
SHARD_PROBLEMS = (CorruptShardError, ShardChanged, StorageError)


def _progress(items, what: str):
    """A progress bar on stderr for the shards of one array (a large store takes minutes);
    tqdm shows nothing when stderr is not a terminal, so pipes and logs stay clean."""
    from tqdm import tqdm  # (when inspecting, not at every start)

    return tqdm(items, desc=what or "/", unit="shard", disable=None, leave=False, file=sys.stderr)


async def _stored_keys(store: Store, prefix: str) -> list[int]:
    """Sizes of every key below `prefix` except metadata (chunks of an array shown as stored)."""
    sizes, todo = [], [prefix]
    while todo:
        p = todo.pop()
        for e in await store.list(p) or []:
            key = f"{p}/{e.name}" if p else e.name
            if e.is_dir:
                todo.append(key)
            elif e.name != META:
                sizes.append(e.size if e.size is not None else await store.size(key) or 0)
    return sizes


async def _describe_array(src: "OpenSource", node: ArrayNode) -> dict:
    meta = node.meta
    info = {
        "path": node.path,
        "shape": list(node.shape),
        "dtype": meta.get("data_type"),
        "sharded": node.sharded,
        "shard_shape": list(node.chunk_shape) if node.sharded else None,
        "inner_chunk_shape": list(node.plan.chunk_shape) if node.plan else (None if node.sharded else list(node.chunk_shape)),
        "codecs": meta.get("codecs"),
        "unsharded": not node.sharded or node.plan is not None,
        "warning": node.warning,
    }
    if node.plan is None:
        sizes = await _stored_keys(src.store, node.path)
        info.update(shards_present=len(sizes) if node.sharded else None,
                    chunks_present=None if node.sharded else len(sizes), bytes=sum(sizes))
        return info
    array = ShardedArray(node, src.store, src.cache)
    shards = chunks = nbytes = 0
    problems = []
    for shard in _progress(await array.stored_shards(), node.path):
        key = array.shard_key(shard)
        try:
            head = await array.head(key)
        except SHARD_PROBLEMS as e:
            shards += 1
            problems.append(str(e))
            continue
        if head is None:
            continue
        shards += 1
        outside = len(head.entries) - len(head.present()) - int((head.entries[:, 0] == EMPTY).sum())
        if outside:
            problems.append(f"corrupt shard {key}: {outside} index entries point outside the shard")
        problems += await _nested_problems(array, key, head)
        found = await array.chunks_in_shard(shard)
        chunks += len(found.coords)
        nbytes += int(found.lengths.sum())
    info.update(shards_present=shards, chunks_present=chunks, bytes=nbytes, problems=problems)
    return info


async def _nested_problems(array: ShardedArray, key: str, head) -> list[str]:
    """Nested shard indexes of one shard that do not decode: the listing leaves their chunks
    out, inspect names them. (The same indexes the listing reads, so mostly cache hits.)"""
    out, todo = [], [(head, 0, 0)]
    while todo:
        idx, start, depth = todo.pop()
        if depth + 1 == len(array.plan.levels):
            continue
        for off, nbytes in idx.entries[idx.present()].tolist():
            try:
                todo.append((await array.index(key, start + off, nbytes, depth + 1, head), start + off, depth + 1))
            except SHARD_PROBLEMS as e:
                out.append(f"{e} (nested shard at byte {start + off})")
    return out


def problems(report: dict) -> list[str]:
    """Every damaged shard the report found (`inspect --strict` fails on any)."""
    return [p for a in report.get("arrays", []) for p in a.get("problems", [])]


async def describe(src: "OpenSource") -> dict:
    out = {"source": src.store.display, "kind": src.kind, "view": src.view, "views": list(src.entry.views)}
    for section in src.entry.sections:
        out[section] = await SECTIONS[section].describe(src, out)
    described = {a["path"] for a in out.get("arrays", [])}
    absent = [{"path": p or "/", "why": why} for p, why in sorted((src.absent or {}).items()) if p not in described]
    if absent:
        out["absent"] = absent
    return out


async def _describe_arrays(src: "OpenSource", out: dict) -> list[dict]:
    arrays = [n for _, n in sorted(src.meta.items()) if isinstance(n, ArrayNode)]
    found = [await _describe_array(src, n) for n in arrays]
    for a in found:  # views other than zarr: arrays they cannot express are absent
        a["in_view"] = a["path"] not in (src.absent or {})
        if not a["in_view"]:
            a["view_warning"] = f"not in the {src.view} view: {src.absent[a['path']]}"
    return found


async def _describe_zvf(src: "OpenSource", out: dict) -> dict:
    arrays = out["arrays"]
    attrs = src.arrays[""].attributes.get("zarr_vectors", {})
    by_path = {a["path"]: a for a in arrays}
    levels = []
    for level in zvf.find_levels(src.arrays):
        oattrs = src.arrays[child_path(level.path, zvf.OBJECT_INDEX)].attributes
        vertices = by_path.get(child_path(level.path, zvf.VERTICES), {})
        levels.append({
            "path": level.path,
            "objects": int(oattrs.get("num_present", oattrs.get("num_objects", level.num_rows))),
            "cells_present": vertices.get("chunks_present"),
            "sharded_arrays": [a["path"] for a in arrays if a["sharded"] and a["path"].startswith(level.path + "/")],
        })
    return {
        "geometry_types": attrs.get("geometry_types", []),
        "zv_version": attrs.get("zv_version"),
        "levels": levels,
        "sharded_arrays": [a["path"] for a in arrays if a["sharded"]],
    }


async def _describe_precomputed(src: "OpenSource", out: dict) -> dict:
    ds = src.meta
    dirs = []
    for sd in ds.sharded.values():
        kv = precomputed.ShardedKV(src.store, sd.path, sd.spec, src.cache)
        per_shard = {}
        for shard in _progress(await kv.shards(), sd.path):
            per_shard[sd.spec.shard_name(shard)] = len(await kv.ids_in_shard(shard))
        entry = {"path": sd.path, "kind": sd.kind, "sharding": asdict(sd.spec),
                 "shards_present": len(per_shard), "chunks": sum(per_shard.values()), "chunks_per_shard": per_shard}
        if sd.scale is not None:
            entry.update(size=list(sd.scale.size), chunk_size=list(sd.scale.chunk_size), voxel_offset=list(sd.scale.voxel_offset))
        dirs.append(entry)
    scales = [{"key": s.get("key"), "sharded": s.get("sharding") is not None} for s in ds.info.get("scales", [])]
    return {"type": ds.info.get("type", ds.info.get("@type")), "scales": scales, "sharded_dirs": dirs}


def _shape(s) -> str:
    return "-" if s is None else "(" + ", ".join(map(str, s)) + ")"


def _codecs(codecs) -> str:
    def name(c):
        if isinstance(c, dict) and c.get("name") == "sharding_indexed":
            return "sharding_indexed[" + ",".join(name(i) for i in c.get("configuration", {}).get("codecs", [])) + "]"
        return c.get("name", "?") if isinstance(c, dict) else str(c)

    return ", ".join(name(c) for c in codecs or [])


def _count(n: int, noun: str) -> str:
    """`1 array`, `2 arrays`, `0 inner chunks`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def render(report: dict) -> str:
    lines = [f"{report['source']}: {report['kind']}, {report['view']} view"
             + (f", {_count(len(report['arrays']), 'array')}" if "arrays" in report else ""),
             f"views: {', '.join(report['views'])} (the first is the default; choose with --view)"]
    for section in KINDS[report["kind"]].sections:
        lines += SECTIONS[section].render(report)
    if report.get("absent"):
        lines.append(f"\nABSENT from the {report['view']} view:")
        lines += [f"  {a['path']}: {a['why']}" for a in report["absent"]]
    found = problems(report)
    if found:
        lines.append(f"\n{len(found)} damaged shard(s): their chunk files read as EIO, the rest of the store is served")
    return "\n".join(lines)


def _render_arrays(report: dict) -> list[str]:
    lines = []
    for a in report["arrays"]:
        lines.append(f"\n{a['path'] or '/'}")
        lines.append(f"  shape {_shape(a['shape'])}  dtype {a['dtype']}")
        lines.append(f"  shard shape {_shape(a['shard_shape'])}  inner chunk shape {_shape(a['inner_chunk_shape'])}")
        lines.append(f"  codecs {_codecs(a['codecs'])}")
        present = []
        if a["shards_present"] is not None:
            present.append(_count(a["shards_present"], "shard"))
        if a["chunks_present"] is not None:
            present.append(_count(a["chunks_present"], "inner chunk"))
        lines.append(f"  present: {', '.join(present)}, {a['bytes']} bytes")
        if a["warning"]:
            lines.append(f"  WARNING: {a['warning']}")
        if not a["in_view"]:
            lines.append(f"  ABSENT: {a['view_warning']}")
        lines += [f"  DAMAGED: {p}" for p in a.get("problems", [])]
    return lines


def _render_zvf(report: dict) -> list[str]:
    z = report["zvf"]
    lines = [f"\nZVF {z['zv_version']}: {', '.join(z['geometry_types'])}; {len(z['levels'])} levels with objects"]
    for lv in z["levels"]:
        lines.append(f"  level {lv['path']}: {lv['objects']} objects, {lv['cells_present']} cells, sharded: {', '.join(lv['sharded_arrays']) or '-'}")
    return lines


def _render_precomputed(report: dict) -> list[str]:
    p = report["precomputed"]
    lines = [f"precomputed {p['type']}"]
    lines += [f"  scale {s['key']}: {'sharded' if s['sharded'] else 'unsharded'}" for s in p["scales"]]
    for d in p["sharded_dirs"]:
        sh = d["sharding"]
        lines.append(f"\n{d['path']}/ ({d['kind']})")
        if "size" in d:
            lines.append(f"  size {_shape(d['size'])}  chunk {_shape(d['chunk_size'])}  voxel_offset {_shape(d['voxel_offset'])}")
        lines.append(f"  sharding: hash {sh['hash']}, preshift {sh['preshift_bits']}, minishard bits {sh['minishard_bits']}, "
                     f"shard bits {sh['shard_bits']}, index {sh['minishard_index_encoding']}, data {sh['data_encoding']}")
        lines.append(f"  {_count(d['shards_present'], 'shard')}, {_count(d['chunks'], 'chunk')}" + (
            f" ({', '.join(f'{k}: {v}' for k, v in list(d['chunks_per_shard'].items())[:8])}{', ...' if len(d['chunks_per_shard']) > 8 else ''})"
            if d["chunks_per_shard"] else ""))
    return lines


class Section(NamedTuple):
    describe: Callable[["OpenSource", dict], Awaitable[object]]
    render: Callable[[dict], list[str]]


#: the sections a kind's registry entry names, in the order they are gathered and shown
SECTIONS = {
    "arrays": Section(_describe_arrays, _render_arrays),
    "zvf": Section(_describe_zvf, _render_zvf),
    "precomputed": Section(_describe_precomputed, _render_precomputed),
}
