"""gs:// sources through gcp-storage-emulator on loopback (issue 25), through real mounts.

The emulator answers a suffix range (`bytes=-N`) with a 200 and the whole object, and its
media answers carry no generation and no ETag; fake-gcs-server (tests/test_memory_budget.py)
does neither. Every test runs with no Google credentials anywhere (no
GOOGLE_APPLICATION_CREDENTIALS, an empty gcloud configuration) and with the cloud metadata
server's address pointed at a loopback recorder, and mounts with `endpoint=` only (no `anon`),
as a user trying an emulator would:

- every Zarr fixture kind (index at the start and at the end, nested sharding, ...) read the
  same from gs:// as from the local disk in every view (zarr-python's store in zarr, zarr2
  and n5; tensorstore's, the same kinds, in zarr), and so does every precomputed fixture set
  (tensorstore's and cloud-volume's sharded scales in precomputed, zarr, zarr2 and n5;
  annotations); no suffix range is asked for an object whose size an answer gave;
- with an index cache too small to keep any index, indexes read again are absolute ranges;
- a chunk read with no listing before (size unknown: a suffix range, answered whole) is right;
- `zvfs inspect --strict` finds no damage;
- nothing asks the metadata server; credentials from GOOGLE_APPLICATION_CREDENTIALS are used
  (the emulator sees their bearer token), none without them;
- gcsfs's experimental bucket-layout probe is never used (`zvfs ls`, and the fsspec front in a
  process that imported gcsfs first, take seconds, not 20-60 s per listing);
- (against fake-gcs-server) a read's version is the object's generation.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import writers
from conftest import run_zvfs, zvfs_mount
from servers import GcsEmulator, free_port, serve_in_thread, stop_server
from test_remote import tree

pytestmark = pytest.mark.mount

ZARR_VIEWS = ("zarr", "zarr2", "n5")
PRECOMPUTED_VIEWS = ("precomputed", "zarr", "zarr2", "n5")
TOKEN = "token-from-the-credentials-file"


class CloudRecorder:
    """A loopback stand-in for the cloud metadata server: the paths of its requests (probes)
    are kept in `metadata`, each answered 404."""

    def __init__(self):
        self.port = free_port()
        self.metadata: list[str] = []
        self._server = None

    def start(self) -> "CloudRecorder":
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                recorder.metadata.append(self.path)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = serve_in_thread(self.port, Handler)
        return self

    def stop(self) -> None:
        stop_server(self._server)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    """The environment of every zvfs started here: no credentials, the metadata server's
    address on the recorder, gcsfs's experimental layer left to zvfs's default."""
    recorder = CloudRecorder().start()
    address = f"127.0.0.1:{recorder.port}"
    with pytest.MonkeyPatch.context() as mp:
        for var in ("GOOGLE_APPLICATION_CREDENTIALS", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "STORAGE_EMULATOR_HOST",
                    "NO_GCE_CHECK"):
            mp.delenv(var, raising=False)
        mp.setenv("CLOUDSDK_CONFIG", str(tmp_path_factory.mktemp("gcloud-empty")))
        mp.setenv("GCE_METADATA_HOST", address)
        mp.setenv("GCE_METADATA_IP", address)
        yield recorder
    recorder.stop()


@pytest.fixture(scope="module")
def gcs(cloud):
    server = GcsEmulator().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mounts(gcs, tmp_path_factory):
    """mount(source, view) -> mount point, once per module; gs:// sources get `endpoint=`."""
    with contextlib.ExitStack() as stack:
        made: dict[tuple[str, str], Path] = {}

        def mount(source: str, view: str) -> Path:
            if (source, view) not in made:
                base = tmp_path_factory.mktemp("mnt-gcs")
                options = [f"view={view}"] + ([f"endpoint={gcs.url}"] if source.startswith("gs://") else [])
                made[(source, view)] = stack.enter_context(
                    zvfs_mount(source, base / "mnt", log=base / "zvfs.log", options=options))
            return made[(source, view)]

        yield mount


def suffix_ranges(gcs: GcsEmulator, since: int) -> list[str]:
    return [r.path for r in gcs.requests[since:] if r.range.startswith("bytes=-")]


def suffix_ranges_of_known_sizes(gcs: GcsEmulator, since: int) -> list[str]:
    """Suffix ranges asked for an object after an answer that gave its size (within one
    mount: callers keep one mount per `since`)."""
    requests = gcs.requests[since:]
    sized: dict[str, float] = {}  # object -> when its size was first answered
    for r in requests:
        if r.status in (200, 206):
            obj = r.path.split("?", 1)[0]
            sized[obj] = min(sized.get(obj, r.answered), r.answered)
    return [r.path for r in requests
            if r.range.startswith("bytes=-") and sized.get(r.path.split("?", 1)[0], r.arrived) < r.arrived]


def assert_same_tree(local: Path, remote: Path, what: str) -> None:
    want, got = tree(local), tree(remote)
    assert sorted(got) == sorted(want), what
    differ = [p for p in want if got[p] != want[p]]
    assert not differ, f"{what}: {len(differ)} files differ, e.g. {differ[:5]}"


@pytest.fixture(scope="module")
def zarr_sources(stores, gcs):
    """writer -> (local store, its gs:// URL)."""
    return {writer: (stores.root(writer), gcs.upload(stores.root(writer), "fixtures", writer))
            for writer in writers.WRITERS}


@pytest.mark.parametrize(("writer", "view"), [("zarr-python", v) for v in ZARR_VIEWS] + [("tensorstore", "zarr")])
def test_zarr_fixtures_read_from_gcs_as_from_disk(zarr_sources, gcs, cloud, mounts, writer, view):
    local, url = zarr_sources[writer]
    since = len(gcs.requests)
    assert_same_tree(mounts(str(local), view), mounts(url, view), f"{writer} --view {view}")
    assert suffix_ranges_of_known_sizes(gcs, since) == []
    assert cloud.metadata == []


@pytest.fixture(scope="module")
def precomputed_sources(tmp_path_factory, gcs, no_mounts_left_behind):
    """name -> (local dataset, its gs:// URL): the precomputed tests' writers (tensorstore,
    cloud-volume, the spec-built annotations)."""
    import writers_precomputed as wp
    from test_precomputed_mount import TS, Precomputed

    with wp.cloudvolume_env(tmp_path_factory.mktemp("cv-env-gcs")), contextlib.ExitStack() as stack:
        pc = Precomputed(tmp_path_factory.mktemp("precomputed-gcs"), stack)
        sets = {name: pc.ts(name) for name in sorted(TS)}
        sets["cv"] = pc.cv().root
        sets["annotations"] = pc.annotations()[0]
        yield {name: (root, gcs.upload(root, "precomputed", name)) for name, root in sets.items()}


@pytest.mark.parametrize("view", PRECOMPUTED_VIEWS)
def test_precomputed_fixtures_read_from_gcs_as_from_disk(precomputed_sources, gcs, cloud, mounts, view):
    for name, (local, url) in precomputed_sources.items():
        if name == "annotations" and view != "precomputed":
            continue  # (no array form: the view refuses the mount, tested in test_precomputed_array_views)
        assert_same_tree(mounts(str(local), view), mounts(url, view), f"{name} --view {view}")
    assert cloud.metadata == []


def test_a_chunk_read_before_any_listing_is_right(stores, zarr_sources, gcs, tmp_path):
    """No listing before: the shard's size is unknown, its index (at the end) is asked for as
    a suffix, which the emulator answers with the whole shard: the slice is the index."""
    writer = "zarr-python"
    local, url = zarr_sources[writer]
    case = next(c for c in writers.CASES if c.sharded and c.index_location == "end" and not c.stored_as_is)
    assert case.path in stores.infos(writer)
    lm = stores.mount(writer)
    chunk = next(p for p in sorted((lm / case.path).rglob("*")) if p.is_file() and not p.name.startswith("zarr"))
    since = len(gcs.requests)
    with zvfs_mount(url, tmp_path / "remote", log=tmp_path / "zvfs.log", options=(f"endpoint={gcs.url}",)) as rm:
        assert (rm / chunk.relative_to(lm)).read_bytes() == chunk.read_bytes()
    assert suffix_ranges(gcs, since), "expected the index to be asked for as a suffix"


def test_indexes_read_again_ask_for_no_suffix(stores, zarr_sources, gcs, tmp_path):
    """An index cache too small to keep any index: every chunk opened reads its shard's index
    again, at the size the first answer gave: an absolute range, not the suffix (which this
    server answers with the whole shard)."""
    _, url = zarr_sources["tensorstore"]
    since = len(gcs.requests)
    with zvfs_mount(url, tmp_path / "remote", log=tmp_path / "zvfs.log",
                    options=(f"endpoint={gcs.url}", "index_cache=1K", "readahead=0")) as rm:
        for part in ("index", "nested"):  # (index at the start and at the end; nested shards)
            assert_same_tree(stores.mount("tensorstore") / part, rm / part, f"{part}, index_cache=1K")
    assert len(suffix_ranges(gcs, since)) > 10
    assert suffix_ranges_of_known_sizes(gcs, since) == []


def test_inspect_finds_no_damage(zarr_sources, gcs):
    for writer, (_, url) in zarr_sources.items():
        r = run_zvfs("inspect", url, "--strict", "-o", f"endpoint={gcs.url}")
        assert r.returncode == 0, (writer, r.stderr.decode()[-2000:])
        assert b"damage" not in r.stdout.lower(), writer


def test_credentials_file_is_used_and_the_metadata_server_never_asked(zarr_sources, gcs, cloud, tmp_path, monkeypatch):
    """Authorized-user credentials (what `gcloud auth application-default login` writes, here
    with an access token valid until 2099, so none is fetched) named by
    GOOGLE_APPLICATION_CREDENTIALS: their token reaches the endpoint; without them the requests
    are anonymous; the metadata server is never asked."""
    creds = tmp_path / "adc.json"
    creds.write_text(json.dumps({"type": "authorized_user", "client_id": "id", "client_secret": "secret",
                                 "refresh_token": "refresh", "token": TOKEN, "expiry": "2099-01-01T00:00:00Z"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    _, url = zarr_sources["zarr-python"]
    gcs.authorizations.clear()
    r = run_zvfs("ls", url, "-o", f"endpoint={gcs.url}")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert gcs.authorizations and set(gcs.authorizations) == {f"Bearer {TOKEN}"}
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    gcs.authorizations.clear()
    r = run_zvfs("ls", url, "-o", f"endpoint={gcs.url}")
    assert r.returncode == 0 and gcs.authorizations and set(gcs.authorizations) == {None}  # anonymous
    assert cloud.metadata == []


FRONT_AFTER_GCSFS = """
import sys, gcsfs, fsspec  # gcsfs first, as a user's own code may: fsspec's gs:// is its default layer
fs = fsspec.filesystem("zvfs", fo=sys.argv[1], endpoint=sys.argv[2])
print(fs.ls("", detail=False))
"""


@pytest.mark.parametrize("how", ["cli", "fsspec front, gcsfs imported first"])
def test_the_bucket_layout_probe_is_off(zarr_sources, gcs, how):
    """gcsfs's experimental layer (its default) probes the bucket's layout over gRPC at
    Google whatever the endpoint: a listing timed out after 20 s against the emulator."""
    _, url = zarr_sources["tensorstore"]
    cmd = ["-m", "zvfs", "ls", url, "-o", f"endpoint={gcs.url}"] if how == "cli" else ["-c", FRONT_AFTER_GCSFS, url, gcs.url]
    t = time.monotonic()
    r = subprocess.run([sys.executable, *cmd], capture_output=True, timeout=120)
    took = time.monotonic() - t
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert b"consolidated" in r.stdout
    assert took < 15, f"took {took:.1f} s"


async def test_versions_are_generations_and_a_same_size_rewrite_is_seen(tmp_path):
    """Against fake-gcs-server, which sends `x-goog-generation` as GCS does (this emulator
    does not): a read's version is the object's generation (gcsfs's `info` agrees), and a read
    expecting it after a rewrite of the same size is ShardChanged (ifGenerationMatch: 412),
    never the new bytes."""
    from servers import GCS
    from zvfs.errors import ShardChanged
    from zvfs.options import parse_options, storage_options
    from zvfs.storage.open import open_store

    server = GCS(tmp_path / "gcs").start()
    try:
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "k").write_bytes(b"a" * 100)
        url = server.upload(tmp_path / "d", "gen", "p")
        opts = storage_options("gs", parse_options([f"endpoint={server.url},anon"]))
        store = open_store(url, storage_options=opts, readahead=0)
        data, version = await store.read_version("k", -10)
        assert data == b"a" * 10
        assert version.tag == ("generation", str(store.fs.info("gen/p/k")["generation"]))
        (tmp_path / "d" / "k").write_bytes(b"b" * 100)
        server.upload(tmp_path / "d", "gen", "p")
        with pytest.raises(ShardChanged):
            await store.read("k", 0, 10, expect=version)
        await store.aclose()
    finally:
        server.stop()
