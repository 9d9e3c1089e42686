"""The Zarr protocol: metadata, chunk keys, codecs and shards, as functions of a layer's description."""
