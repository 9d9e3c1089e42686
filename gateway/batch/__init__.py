"""Work over a whole layer, split into blocks and run as tasks on dask.distributed (or in one process)."""
