"""The shard formats the gateway reads and writes, each in one module named after it and standing alone: bytes
in, facts out, nothing of the project imported but the kinds of fault their errors are, so sources, the Zarr
protocol and the meshes share one definition of each fact (an index entry's layout, the hash).

- :mod:`.sharding_indexed`: Zarr v3's ``sharding_indexed`` codec, its shard index and where it lies.
- :mod:`.neuroglancer_sharded`: Neuroglancer precomputed's ``neuroglancer_uint64_sharded_v1`` (chunk ids, the
  hash, shard and minishard indexes).
"""
