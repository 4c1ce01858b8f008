"""The consistency model over HTTP (nginx), S3 (moto's server) and GCS (fake-gcs-server),
through real mounts.

Same fixtures as tests/test_consistency.py (zarr-python writes the old and the new data); the
shard object is replaced on the server while its index is cached by the mount. Every chunk
file then reads as the old chunk, the new chunk, or EIO/ENOENT, never another chunk's bytes;
after `zvfs refresh` everything reads as the new data; a deleted shard reads as fill.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import zarr

from conftest import run_zvfs, zvfs_mount
from servers import GCS, S3, Nginx
from test_consistency import SHAPE, _check_before_or_after, _chunk_bytes, _read_each, _stores

pytestmark = pytest.mark.mount


@pytest.mark.parametrize("where", ["http", "s3", "gcs"])
def test_a_replaced_or_deleted_remote_shard_is_never_read_through_the_old_index(tmp_path, where):
    src, upd, old, new = _stores(tmp_path)
    before, after = _chunk_bytes(old), _chunk_bytes(new)
    new_bytes = (upd / "c/0/0").read_bytes()
    server = {"http": lambda: Nginx(tmp_path, tmp_path / "nginx"), "s3": S3,
              "gcs": lambda: GCS(tmp_path / "gcs")}[where]().start()
    try:
        if where == "http":
            url, options = f"{server.url}/store.zarr", []

            def replace(data: bytes | None) -> None:
                shard = src / "c/0/0"
                if data is None:
                    shard.unlink()
                    return
                tmp = shard.with_name("0.tmp")
                tmp.write_bytes(data)
                st = shard.stat()
                os.utime(tmp, (st.st_mtime + 10, st.st_mtime + 10))  # nginx's ETag: mtime (s) and size
                os.replace(tmp, shard)
        elif where == "gcs":  # (fake-gcs-server: versions are generations, sent back as ifGenerationMatch)
            import urllib.request

            url, options = server.upload(src, "consistency", "store"), [f"endpoint={server.url}", "anon"]

            def replace(data: bytes | None) -> None:
                if data is None:
                    request = urllib.request.Request(f"{server.url}/storage/v1/b/consistency/o/store%2Fc%2F0%2F0",
                                                     method="DELETE")
                else:
                    request = urllib.request.Request(
                        f"{server.url}/upload/storage/v1/b/consistency/o?uploadType=media&name=store%2Fc%2F0%2F0",
                        data=data, method="POST", headers={"Content-Type": "application/octet-stream"})
                urllib.request.urlopen(request, timeout=30).read()
        else:
            import boto3

            url, options = server.upload(src, "consistency", "store"), [f"endpoint={server.endpoint}"]
            client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")

            def replace(data: bytes | None) -> None:
                if data is None:
                    client.delete_object(Bucket="consistency", Key="store/c/0/0")
                else:
                    client.put_object(Bucket="consistency", Key="store/c/0/0", Body=data)

        with zvfs_mount(url, tmp_path / "mnt", log=tmp_path / "zvfs.log", options=options) as mnt:
            assert (mnt / "c/1/1").read_bytes() == before["c/1/1"]  # the shard's index is cached now
            replace(new_bytes)
            _check_before_or_after(_read_each(mnt), before, after)
            assert run_zvfs("refresh", mnt).returncode == 0
            got = _read_each(mnt)
            assert got == {k: after.get(k, errno.ENOENT) for k in got}
            np.testing.assert_array_equal(zarr.open_array(str(mnt))[...], new)
            replace(None)
            _check_before_or_after(_read_each(mnt), after, {})
            assert run_zvfs("refresh", mnt).returncode == 0
            assert set(_read_each(mnt).values()) == {errno.ENOENT}
            np.testing.assert_array_equal(zarr.open_array(str(mnt))[...], np.zeros(SHAPE, np.uint16))
    finally:
        server.stop()
