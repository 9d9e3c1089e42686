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

# Seconds a module took in scripts/test's parallel run on a busy two-core machine (its --durations and
# single-module runs); a rough guide, refreshed when the suite's shape changes. Unlisted modules are shorter.
KNOWN_SECONDS = {
    "test_containers.py": 300,  # builds the images, starts the compose stack in a Docker engine of its own
    "test_bench.py": 210,  # the benchmark's short mode
    "test_failover.py": 200,  # the soak: two minutes of load through nginx
    "test_viewers.py": 150,  # Neuroglancer in Chromium
    "test_packaging.py": 100,  # fresh venvs installed from the package index
    "test_own_viewer.py": 100,
    "test_precomputed_tree.py": 90,
    "test_distributed_index.py": 60,
    "test_deploy.py": 60,
    "test_kubernetes.py": 60,
    "test_remote_roots.py": 60,
    "test_mesh_viewer.py": 50,
    "test_stored_meshes.py": 50,
    "test_object_storage.py": 50,
    "test_proxy_cache.py": 40,
    "test_ops.py": 40,
    "test_sample.py": 30,
    "test_stored_mesh_viewer.py": 30,
    "test_tls_proxy.py": 30,
}


def longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: modules by their known seconds, then by their number of tests, both descending."""
    tests = Counter(item.path.name for item in items)
    items.sort(key=lambda item: (-KNOWN_SECONDS.get(item.path.name, 0), -tests[item.path.name], str(item.path)))
