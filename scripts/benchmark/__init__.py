"""The gateway's benchmark: ``scripts/bench [--short] [--out DIR]`` (``python -m benchmark`` from scripts/).

It writes a WKW dataset (an LZ4HC uint8 layer and a raw uint16 layer, each 4096 x 4096 x 2048 voxels
of virtual extent, of which only the files that requests touch exist), then measures, in one run, with
one load generator (wrk on loopback, the same connections and threads for every case) and, per group,
the same sequence of chunk keys:

- nginx serving exactly the bytes the gateway serves for those keys, as static files (the ceiling),
- a minimal Starlette app and a bare ASGI callable returning the same bytes from a dict in memory
  (the Python floors), and on Granian a bare callable of its native RSGI interface (the RSGI floor),
- the gateway: LZ4 pass-through, raw uint16 pass-through, re-encoding (zstd), 64^3 and 128^3 chunks,
  and byte ranges of virtual shards (what tensorstore sends),
- the floors and the gateway on uvicorn and on Granian,
- the gateway with tokens, direct and behind the deployment's proxy (deploy/nginx.conf),
- xpublish serving the same voxels as a dask-backed xarray dataset (the nearest Python peer).

It also reports peak RSS per worker after a long run spread over thousands of small files, and the
time tensorstore takes to read a whole mag through the gateway against reading a local Zarr v3
sharded copy of it, and how long Neuroglancer in headless Chromium takes to load a fixed view
directly, through the proxy over HTTP/1.1 and through its TLS listener over HTTP/2 (viewer). A
benchmark-only build without the block check (unchecked) shows that check's cost. Results go to
``DIR/results.md``, ``results.json`` and ``results.png``.

Servers and the load generator share the machine's cores, so absolute figures depend on the machine
and on what else runs there; the ratios, taken within one run, are what to compare. ``--short`` (CI)
spends a second per case, measures the cases of a group (and the routes of a Zipf row) side by side, and
scales every workload down: it shows that every case runs and reports; the figures come from the full mode.

Modules: config (workloads, cases), dataset, keys (request sequences), processes and nginx (the
servers), apps (the floors and xpublish), load (wrk and walk.lua), prepare (reference bytes and
checks), measure (the interleaved rounds), long_runs (RSS, tensorstore), viewer, unchecked, profiling, report.
"""
