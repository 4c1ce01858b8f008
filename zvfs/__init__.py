"""zvfs: sharded chunked stores as their unsharded one-file-per-chunk trees, over FUSE."""
