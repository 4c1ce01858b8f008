"""A precomputed segmentation with sharded skeletons and meshes made by igneous itself.

igneous (the pipeline most sharded precomputed data comes from) leaves its own files beside the
shards: spatial indexes (`*.spatial.gz`), `0.labels.gz`, `*.frags`, `provenance`; cloud-volume's
spatial-index queries read them. Here cloud-volume writes a small labelled volume and igneous's
own tasks (meshing, multiresolution shard merge, kimimaro skeletonizing, skeleton shard merge,
a sharded 2x downsample as scale 1) run on it through a LocalTaskQueue, so the directories hold
exactly what igneous writes.

igneous runs in a venv of its own, made on first use and kept (measured: 58 s on an idle machine,
up to 105 s beside other engineers' test runs; later sessions reuse it): in the test venv it breaks existing tests, because it pins DracoPy < 2 (cloud-volume
there uses 2.x) and pulls in zfpy 1.0.1.post0, whose version string makes numcodecs (hence
zarr) fail at import. The writing runs there as `python writers_igneous.py OUT` (this file:
stdlib at module level, the writer's imports inside `write`), takes about 3 s, and is
checked by nothing of zvfs: the test reads the result with cloud-volume from the test venv.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

REQUIREMENT = "igneous-pipeline==4.37.0"
#: where the igneous venv lives (outside the checkout: it is a cache, not a build product)
VENV = Path(os.environ.get("ZVFS_IGNEOUS_VENV", Path.home() / ".cache" / "zvfs-tests" / "igneous-venv"))
SHAPE = (128, 128, 128)
CHUNK = (64, 64, 64)
RESOLUTION = (8, 8, 40)
LABELS = [100 + 7 * i for i in range(6)]
CV_ENV = ("CLOUD_FILES_DIR", "CLOUD_FILES_LOCK_DIR", "CLOUD_VOLUME_DIR")


def igneous_python() -> Path:
    """The igneous venv's interpreter, making the venv first if needed (a lock keeps two test
    sessions from building it at once; a marker naming the requirement says it is complete)."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    marker = VENV / "zvfs-requirement"
    python = VENV / "bin" / "python"
    with open(VENV.parent / (VENV.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (marker.exists() and marker.read_text() == REQUIREMENT):
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True, timeout=120)
            r = subprocess.run([str(python), "-m", "pip", "install", "-q", REQUIREMENT], capture_output=True, timeout=900)
            if r.returncode != 0:
                raise RuntimeError(f"pip install {REQUIREMENT} into {VENV} failed:\n{r.stderr.decode(errors='replace')[-3000:]}")
            marker.write_text(REQUIREMENT)
    return python


def write_igneous_dataset(out: Path) -> Path:
    """Write the dataset under `out` with igneous (in its own venv); returns its root."""
    out = Path(out)
    env = dict(os.environ)
    for k in CV_ENV:
        env[k] = str(out / "cv-env" / k.lower())
    r = subprocess.run([str(igneous_python()), __file__, str(out)], capture_output=True, timeout=600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"the igneous writer failed:\n{r.stderr.decode(errors='replace')[-3000:]}")
    return out / "seg"


def blobs():
    """Six elongated ellipsoids (one per label, along x, y or z in turn), so kimimaro makes
    skeletons of several vertices and the meshes span more than one 64^3 task."""
    import numpy as np

    labels = np.zeros(SHAPE, dtype=np.uint32)
    rng = np.random.default_rng(14)
    grid = np.meshgrid(*(np.arange(s) for s in SHAPE), indexing="ij")
    for i, label in enumerate(LABELS):
        centre, radius = rng.integers(24, 104, 3), int(rng.integers(10, 18))
        d = [(g - c) ** 2 for g, c in zip(grid, centre)]
        d[i % 3] = d[i % 3] / 9
        labels[(d[0] + d[1] + d[2]) < radius * radius] = label
    return labels


def write(out: Path) -> None:
    """Runs in the igneous venv."""
    from cloudvolume import CloudVolume
    import igneous.task_creation as tc
    from taskqueue import LocalTaskQueue

    path = f"file://{out / 'seg'}"
    info = CloudVolume.create_new_info(1, "segmentation", "uint32", "raw", list(RESOLUTION), [0, 0, 0], list(SHAPE),
                                       chunk_size=list(CHUNK))
    vol = CloudVolume(path, info=info, compress=False, progress=False)
    vol.commit_info()
    vol[:, :, :] = blobs()
    tq = LocalTaskQueue(parallel=1, progress=False)
    # in order: each merge step plans its shards from the spatial index the step before wrote
    for make in (lambda: tc.create_meshing_tasks(path, mip=0, shape=CHUNK, sharded=True, spatial_index=True),
                 lambda: tc.create_sharded_multires_mesh_tasks(path, num_lod=1, progress=False),
                 lambda: tc.create_skeletonizing_tasks(path, mip=0, shape=CHUNK, sharded=True, spatial_index=True,
                                                       dust_threshold=10),
                 lambda: tc.create_sharded_skeleton_merge_tasks(path, dust_threshold=10, tick_threshold=10),
                 lambda: tc.create_image_shard_downsample_tasks(path, mip=0, factor=(2, 2, 2), chunk_size=(32, 32, 32),
                                                               num_mips=1)):
        tq.insert(make())
        tq.execute(progress=False)


if __name__ == "__main__":
    write(Path(sys.argv[1]))
