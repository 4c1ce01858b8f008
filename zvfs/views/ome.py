"""OME-NGFF metadata for the views that serve older tools.

OME-Zarr 0.5 (Zarr v3) keeps its metadata in one `"ome"` attribute: `{"ome": {"version": "0.5",
"multiscales": [...], "omero": ..., "labels": [...], "image-label": ...}}`. OME-NGFF 0.4
readers (ome-zarr-py < 0.11, napari-ome-zarr, Fiji/MoBIE, QuPath of that generation) look
for the same blocks at the top level of `.zattrs`, each versioned "0.4" where 0.4 versions it
(multiscales, image-label, plate, well). The content of the blocks is the same in both
versions (axes, datasets, coordinateTransformations, omero channels, label colors), so the
translation moves and re-versions them and keeps every other attribute.

N5 tools know nothing of OME: BigDataViewer/n5-viewer, Paintera and Neuroglancer's N5 source
read a multiscale image as a group with `multiScale: true`, `scales` (per level downsampling
factors), `resolution`, `axes`, `units`, and level datasets named s0, s1, ... that each
carry `downsamplingFactors` and `pixelResolution {"unit", "dimensions"}`; all lists in N5
axis order (x first, the reverse of the array's). `N5Multiscale` derives them from the OME
multiscales block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

NGFF_04 = "0.4"
#: blocks that 0.4 versions inside themselves
VERSIONED = ("image-label", "plate", "well")
#: OME (UDUNITS-2) unit names -> the abbreviations N5 tools show and parse
UNIT_SYMBOLS = {"angstrom": "Å", "picometer": "pm", "nanometer": "nm", "micrometer": "um",
                "millimeter": "mm", "centimeter": "cm", "meter": "m", "kilometer": "km",
                "nanosecond": "ns", "microsecond": "us", "millisecond": "ms", "second": "s",
                "minute": "min", "hour": "h", "day": "d"}


def ome_block(attrs: dict) -> dict | None:
    """The `"ome"` block of an OME-Zarr >= 0.5 node, else None. Its "version" may be missing:
    ome-zarr-py writes the labels group as `{"ome": {"labels": [...]}}`."""
    ome = attrs.get("ome") if isinstance(attrs, dict) else None
    if isinstance(ome, dict) and (ome.get("version") is None or str(ome["version"]) >= "0.5"):
        return ome
    return None


def ome04_attributes(attrs: dict) -> dict:
    """The attributes a 0.4 reader expects for a node written as OME-Zarr 0.5; anything else
    unchanged."""
    ome = ome_block(attrs)
    if ome is None:
        return attrs
    out = {k: v for k, v in attrs.items() if k != "ome"}
    for key, value in ome.items():
        if key == "version":
            continue
        if key == "multiscales" and isinstance(value, list):
            value = [{**m, "version": NGFF_04} if isinstance(m, dict) else m for m in value]
        elif key in VERSIONED and isinstance(value, dict):
            value = {**value, "version": NGFF_04}
        out[key] = value
    return out


def multiscales_of(attrs: dict) -> list:
    """The multiscales block of a node, in 0.4 or 0.5 form."""
    ms = ome04_attributes(attrs).get("multiscales")
    return ms if isinstance(ms, list) else []


def _scale(transforms) -> list[float] | None:
    for t in transforms or []:
        if isinstance(t, dict) and t.get("type") == "scale" and isinstance(t.get("scale"), list):
            return [float(s) for s in t["scale"]]
    return None


def _factor(a: float, b: float) -> float | int:
    f = a / b if b else 1.0
    return round(f) if math.isclose(f, round(f), rel_tol=1e-6) else f


@dataclass
class N5Multiscale:
    """The N5 multiscale conventions for one OME multiscale image group."""

    levels: list[str]  # the levels' dataset paths relative to the group, highest resolution first
    scales: list[list[float]]  # per level, the physical size of a pixel (array axis order)
    axes: list[str]
    units: list[str]
    types: list[str]
    names: dict[str, str] = field(default_factory=dict)  # view name (s0, s1, ...) -> level path

    @classmethod
    def from_attributes(cls, attrs: dict, is_array) -> "N5Multiscale | None":
        """None when the group is not an OME multiscale image with per-level scale transforms
        over arrays below it (`is_array(relative path)`)."""
        ms = multiscales_of(attrs)
        if not ms or not isinstance(ms[0], dict):
            return None
        m = ms[0]
        axes = m.get("axes") or []
        names = [a.get("name", "") if isinstance(a, dict) else str(a) for a in axes]
        units = [UNIT_SYMBOLS.get(a.get("unit", ""), a.get("unit", "")) if isinstance(a, dict) else "" for a in axes]
        types = [a.get("type", "") if isinstance(a, dict) else "" for a in axes]
        glob = _scale(m.get("coordinateTransformations")) or [1.0] * len(axes)
        levels, scales = [], []
        for d in m.get("datasets") or []:
            path = d.get("path") if isinstance(d, dict) else None
            scale = _scale(d.get("coordinateTransformations")) if isinstance(d, dict) else None
            if not isinstance(path, str) or not is_array(path) or scale is None or len(scale) != len(names) \
                    or len(glob) != len(names):
                return None
            levels.append(path)
            scales.append([s * g for s, g in zip(scale, glob)])
        if not levels:
            return None
        return cls(levels, scales, names, units, types, {f"s{i}": p for i, p in enumerate(levels)})

    def view_name(self, stored: str) -> str:
        return next((v for v, s in self.names.items() if s == stored), stored)

    def factors(self, i: int) -> list:
        return [_factor(s, s0) for s, s0 in zip(self.scales[i], self.scales[0])]

    def space_unit(self) -> str:
        """pixelResolution has one unit: that of the space axes (x's), "pixel" when none."""
        units = [u for u, t in zip(self.units, self.types) if u and t == "space"]
        return units[-1] if units else "pixel"

    def group_attributes(self) -> dict:
        return {
            "multiScale": True,
            "scales": [list(reversed(self.factors(i))) for i in range(len(self.levels))],
            "resolution": list(reversed(self.scales[0])),
            "axes": list(reversed(self.axes)),
            "units": list(reversed(self.units)),
            "pixelResolution": {"unit": self.space_unit(), "dimensions": list(reversed(self.scales[0]))},
        }

    def level_attributes(self, stored: str) -> dict:
        i = self.levels.index(stored)
        return {
            "downsamplingFactors": list(reversed(self.factors(i))),
            "pixelResolution": {"unit": self.space_unit(), "dimensions": list(reversed(self.scales[i]))},
        }

    def ome_attributes(self, attrs: dict) -> dict:
        """The group's OME metadata (0.4 form, the form N5 tools that read OME-NGFF from N5
        containers expect) with dataset paths under their view names."""
        out = ome04_attributes(attrs)
        ms = [dict(m) for m in out["multiscales"]]
        ms[0]["datasets"] = [{**d, "path": self.view_name(d["path"])} for d in ms[0]["datasets"]]
        return {**out, "multiscales": ms}
