"""The Neuroglancer precomputed tree: every layer as a precomputed volume that CloudVolume and Neuroglancer read."""
