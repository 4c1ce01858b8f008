"""Stores as tools outside the project write them (issue 23, points 11-14): CF data written
by xarray, Zarr v3 arrays written by tensorstore, an OME-Zarr 0.5 HCS plate with labels
written by ome-zarr-py. Each writer is the real tool with its own defaults; only the data and
the few settings a user would pass (chunks, shards, CF encoding) are chosen here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

#: the variables (data and coordinates) of `write_cf_dataset`'s groups, each with what it tests
CF_VARIABLES = {
    "": {
        "t2m": "float32, units K, NaN values and a whole chunk of NaN (not stored: the fill value)",
        "tp": "int16 packed with scale_factor/add_offset, _FillValue -32767 (NaN), real zeros, all-zero chunks",
        "lsm": "uint8 land-sea mask, units, zeros and all-zero chunks (not stored)",
        "time": "int64 hours since the first step (time[0] is stored as 0)",
        "lat": "float64 coordinate with units",
        "lon": "float64 coordinate with units",
    },
    "ensemble": {
        "t2m": "float32 per ensemble member",
        "number": "int64 dimension coordinate, members 0, 1, 2 (0 is the fill value)",
        "step": "0-d int64 coordinate, no attributes",
        "surface": "0-d float64 coordinate 0.0",
        "lat": "float64 coordinate with units",
        "lon": "float64 coordinate with units",
    },
}


def _latlon(ny: int, nx: int) -> dict:
    return {"lat": ("lat", np.linspace(60, -60, ny), {"units": "degrees_north", "standard_name": "latitude"}),
            "lon": ("lon", np.linspace(0, 350, nx), {"units": "degrees_east", "standard_name": "longitude"})}


def cf_dataset():
    """A small weather-style dataset: time x lat x lon, CF attributes."""
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(23)
    nt, ny, nx = 8, 24, 36
    t2m = (250 + 40 * rng.random((nt, ny, nx))).astype(np.float32)
    t2m[0, :3, :5] = np.nan
    t2m[1, :12, :12] = np.nan  # one whole (1, 12, 12) chunk of NaN
    tp = np.round(rng.random((nt, ny, nx)) * 0.003, 4)
    tp[:, 12:, 24:] = 0.0  # whole chunks of real zeros
    tp[2, 0, :4] = np.nan  # stored as _FillValue
    lsm = (rng.random((ny, nx)) > 0.4).astype(np.uint8)
    lsm[:12, :] = 0  # whole chunks of zeros (the fill value: not stored)
    return xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 metre temperature",
                                               "standard_name": "air_temperature"}),
         "tp": (("time", "lat", "lon"), tp, {"units": "m", "long_name": "Total precipitation"}),
         "lsm": (("lat", "lon"), lsm, {"units": "1", "long_name": "Land-sea mask"})},
        coords={"time": pd.date_range("2000-01-01", periods=nt, freq="6h"), **_latlon(ny, nx)},
        attrs={"Conventions": "CF-1.7", "institution": "zvfs tests"})


def cf_ensemble():
    """An ensemble forecast as cfgrib decodes one: members 0..2, scalar coordinates."""
    import xarray as xr

    rng = np.random.default_rng(24)
    t2m = (250 + 40 * rng.random((3, 24, 36))).astype(np.float32)
    return xr.Dataset(
        {"t2m": (("number", "lat", "lon"), t2m, {"units": "K", "long_name": "2 metre temperature"})},
        coords={"number": ("number", np.arange(3, dtype=np.int64), {"long_name": "ensemble member numerical id",
                                                                    "units": "1", "standard_name": "realization"}),
                "step": ((), np.int64(0)),
                "surface": ((), np.float64(0.0), {"long_name": "original GRIB coordinate for key: level(surface)"}),
                **_latlon(24, 36)})


def write_cf_dataset(root: Path, zarr_format: int = 3) -> None:
    """`cf_dataset()` at the root and `cf_ensemble()` in group `ensemble`, written by xarray
    with zarr-python 3 with consolidated metadata (`tp` packed as int16): Zarr v3 sharded
    (xarray's `shards` encoding), or Zarr v2 (the same chunks: what xarray's own v2 writer
    makes of the same data)."""
    enc = {"t2m": {"chunks": (1, 12, 12), "shards": (4, 24, 36)},
           "tp": {"chunks": (1, 12, 12), "shards": (8, 24, 36), "dtype": "int16", "scale_factor": 1e-4,
                  "add_offset": 0.0, "_FillValue": -32767},
           "lsm": {"chunks": (12, 12), "shards": (24, 36)}}
    ens = {"t2m": {"chunks": (1, 12, 12), "shards": (3, 24, 36)}}
    if zarr_format == 2:
        enc, ens = ({name: {k: v for k, v in e.items() if k != "shards"} for name, e in d.items()} for d in (enc, ens))
    with warnings.catch_warnings():  # "consolidated metadata is not part of the v3 spec"
        warnings.simplefilter("ignore")
        cf_dataset().to_zarr(str(root), mode="w", zarr_format=zarr_format, consolidated=True, encoding=enc)
        cf_ensemble().to_zarr(str(root), group="ensemble", mode="a", zarr_format=zarr_format, consolidated=True,
                              encoding=ens)


#: tensorstore `zarr3` arrays: name -> (inner codecs of the shards, what it tests)
TS_ZSTD = {"name": "zstd", "configuration": {"level": 1, "checksum": True}}
TS_VARIANTS = {
    "zstd_checksum": ([{"name": "bytes", "configuration": {"endian": "little"}}, TS_ZSTD],
                      "C order, zstd with checksums (what a v2 compressor cannot say)"),
    "fortran": ([{"name": "transpose", "configuration": {"order": [2, 1, 0]}},
                 {"name": "bytes", "configuration": {"endian": "little"}}, TS_ZSTD],
                "Fortran order (a full transpose): N5 keeps the axes"),
}


def write_tensorstore_variants(root: Path) -> None:
    """A group (zarr-python 3) of sharded int16 arrays written by tensorstore's `zarr3`
    driver, with dimension names and a CF `units` attribute."""
    import tensorstore as ts
    import zarr

    zarr.open_group(str(root), mode="w", zarr_format=3)
    data = np.arange(6 * 20 * 36, dtype=np.int16).reshape(6, 20, 36) - 2000
    for name, (codecs, _) in TS_VARIANTS.items():
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / name)}, "create": True,
                     "metadata": {"shape": [6, 20, 36], "data_type": "int16", "dimension_names": ["time", "lat", "lon"],
                                  "attributes": {"units": "K", "long_name": name},
                                  "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 20, 36]}},
                                  "codecs": [{"name": "sharding_indexed", "configuration": {
                                      "chunk_shape": [1, 10, 12], "codecs": codecs}}]}}).result()
        t.write(data).result()


#: run in the ome05 venv (ome-zarr-py >= 0.11, zarr 3): an OME-Zarr 0.5 HCS plate, two wells
#: of two fields, each field a czyx uint16 image (two levels, sharded) with a label image
WRITE_HCS_PLATE = r'''
import sys, numpy as np, zarr
from ome_zarr.format import FormatV05
from ome_zarr.writer import write_image, write_labels, write_plate_metadata, write_well_metadata

out = sys.argv[1]
rng = np.random.default_rng(11)
fmt = FormatV05()
plate = zarr.open_group(out, mode="w", zarr_format=3)
wells = ["A/1", "B/2"]
write_plate_metadata(plate, ["A", "B"], ["1", "2"], wells, fmt=fmt, name="test plate", field_count=2)
for well in wells:
    row, col = well.split("/")
    wg = plate.require_group(row).require_group(col)
    write_well_metadata(wg, [{"path": "0"}, {"path": "1"}], fmt=fmt)
    for field in ("0", "1"):
        image = wg.require_group(field)
        data = rng.integers(0, 4000, size=(2, 4, 48, 40), dtype=np.uint16)
        write_image(data, image, axes="czyx", fmt=fmt, scale_factors=(2,),
                    storage_options={"chunks": (1, 2, 16, 16), "shards": (1, 4, 32, 32)})
        nuclei = np.zeros((4, 48, 40), dtype=np.uint32)  # mostly background: chunks not stored
        nuclei[1:3, 5:20, 6:30] = 7
        write_labels(nuclei, image, name="nuclei", axes="zyx", fmt=fmt, scale_factors=(2,),
                     storage_options={"chunks": (2, 16, 16), "shards": (4, 32, 32)})
'''
