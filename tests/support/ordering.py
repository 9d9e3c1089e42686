"""The order in which pytest-xdist hands out test modules: the longest first.

``scripts/test`` spreads modules over the workers in collection order (``--dist loadfile
--no-loadscope-reorder``); each worker takes the next module when it runs out. Started last, a module
of minutes runs alone while the other workers idle, so the modules known to take long come first,
longest first, and every other module follows, those with more tests before those with fewer (what
pytest-xdist's own reordering does). The order only changes when a module runs, never what it checks:
the tests of a module keep their order.
"""

from collections import Counter

import pytest

# Seconds a module took in scripts/test's parallel run on a busy two-core machine (a per-test timeline of one
# whole run); a rough guide, refreshed when the suite's shape changes. Unlisted modules are shorter.
KNOWN_SECONDS = {
    "test_containers.py": 400,  # builds the images, starts the compose stack in a Docker engine of its own
    "test_bench.py": 310,  # the benchmark's short mode
    "test_failover.py": 280,  # the soak: two minutes of load through nginx
    "test_remote_roots.py": 220,  # S3, GCS and Azure emulators
    "test_object_storage.py": 180,
    "test_packaging.py": 160,  # fresh venvs installed from the package index
    "test_viewers.py": 160,  # Neuroglancer in Chromium
    "test_mesh_lab_labels.py": 150,  # a million-voxel sheet and ragged cells meshed whole, a mesh-segments run
    "test_distributed_index.py": 120,  # dask.distributed clusters
    "test_precomputed_sources.py": 120,
    "test_meshes.py": 90,
    "test_batch_object_stores.py": 80,  # moto and Azurite, index-segments and mesh-segments into each
    "test_batch_selection.py": 75,  # the batch CLI four times, a dask LocalCluster once
    "test_own_viewer.py": 90,
    "test_precomputed_tree.py": 80,
    "test_fuzz_catalog_bounds.py": 110,  # generated properties files; segment lists, documents, listings in a budget
    "test_fuzz_read_bounds.py": 80,  # damaged layers, metadata multipliers and mesh chunk shapes through gateways
    "test_mappings.py": 110,  # mapped layers read by four clients, bad mapping files, rewritten groups, meshes
    "test_precomputed_matrix.py": 60,  # CloudVolume through three gateways, some sixty layers
    "test_n5_precomputed.py": 75,
    "test_stored_meshes.py": 75,
    "test_mesh_viewer.py": 70,
    "test_browser_path.py": 65,  # Chromium clicking through pages, nginx in front, webknossos-libs, index-segments
    "test_oidc_browser.py": 65,  # signs in through a real OpenID provider in Chromium, then Neuroglancer draws
    "test_oidc.py": 110,  # a real OpenID provider (node), restarted; CloudVolume over the TLS proxy; a signed-in walk
    "test_kubernetes.py": 50,
    "test_hostile_data.py": 75,  # stalled readers of a virtual shard on both servers
    "test_deploy.py": 60,  # nginx in front of two gateways, a slow head held to the proxy's header timeout
    "test_servers.py": 45,
    "test_proxy_cache.py": 30,
    "test_share_links.py": 90,  # two gateways, three clients, nginx, a walk of every link in four credential forms
    "test_share_viewer.py": 60,  # Neuroglancer in Chromium below a link
    "test_mapping_viewer.py": 60,  # Neuroglancer in Chromium draws a mapped layer three times
    "test_mapping_files_follow.py": 25,  # mapping files added and removed under a running gateway
    "test_mesh_segments.py": 40,
    "test_store_contract.py": 20,  # moto; the contract over every store and each view of one (local and S3)
    "test_data_stamp.py": 25,
    "test_data_safety.py": 25,
    "test_chunk_rewrites.py": 25,
    "test_kept_front.py": 35,  # kept answers before dispatch: rewrites under load, tokens changed under gateways
}


def longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: modules by their known seconds, then by their number of tests, both descending."""
    tests = Counter(item.path.name for item in items)
    items.sort(key=lambda item: (-KNOWN_SECONDS.get(item.path.name, 0), -tests[item.path.name], str(item.path)))
