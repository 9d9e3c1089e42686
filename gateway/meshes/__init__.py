"""Neuroglancer precomputed meshes and segment lists of segmentation layers, made on demand."""
