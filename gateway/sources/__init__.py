"""Where a layer's voxels come from: datasource properties, discovery, and mag sources."""
