// zarrita.js in node: read whole arrays from a store and write each one's bytes for the test.
//   node read_arrays.mjs JOB.json
// JOB: {"root": "http://host:port/" or a directory, "arrays": ["a/b", ...], "out": DIR}.
// For array i: DIR/i.bin (the values as zarrita returns them, native byte order) and an entry
// in DIR/result.json: {"path", "dtype", "shape", "stride"} or {"path", "error"}.
import * as zarr from "zarrita";
import FileSystemStore from "@zarrita/storage/fs";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const store = /^https?:/.test(job.root) ? new zarr.FetchStore(job.root) : new FileSystemStore(job.root);
const root = zarr.root(store);
const results = [];
for (const [i, path] of job.arrays.entries()) {
  try {
    const arr = await zarr.open(root.resolve(path), { kind: "array" });
    // (a 0-d array's `get` is its one value: its only chunk has the typed array)
    const got = arr.shape.length ? await zarr.get(arr) : await arr.getChunk([]);
    const data = got.data;
    if (!ArrayBuffer.isView(data)) throw new Error(`not a typed array: ${arr.dtype}`);
    writeFileSync(join(job.out, `${i}.bin`), new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
    results.push({ path, dtype: arr.dtype, shape: got.shape, stride: got.stride });
  } catch (e) {
    results.push({ path, error: String(e && e.message || e) });
  }
}
writeFileSync(join(job.out, "result.json"), JSON.stringify(results));
