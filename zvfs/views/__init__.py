"""View layer: how the unsharded tree is named and what its metadata files say."""
