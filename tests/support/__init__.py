"""Shared test support: what more than one test module needs, so that test modules import nothing from each other.

Test modules import it as ``support`` (pytest puts ``tests/`` on ``sys.path``, since ``tests/`` has a
``conftest.py`` and no ``__init__.py``); ``conftest.py`` holds only fixtures, built from these modules.

- ``processes``: ``free_port``, ``stop_process``, ``wait_until`` (the one bounded poll) and
  ``wait_until_answering`` (start-and-poll of a server process).
- ``servers``: ``Server`` and ``start_server``: a real gateway (``python -m gateway serve``) on a loopback port.
- ``datasets``: the main test dataset (written by webknossos-libs in WKW): its organization, tokens, layers,
  mags and bounding box, ``write_test_root`` and ``WrittenDataset`` (what every mag must read as).
- ``zarr_datasets``: Zarr v2/v3 datasets written by webknossos-libs and zarr-python, ``ServedArray``
  (what each must read as) and the checks that read them through the clients.
- ``clients``: ``read_tensorstore`` and ``read_zarr_python`` on a served array's URL.
- ``metrics``: the gateway's Prometheus metrics scraped, and differences between two scrapes.
- ``proxy``: deploy/nginx.conf run by a real nginx (``start_proxy``, ``Proxy``) and ``tool`` (a system tool's path).
- ``s3``: moto's real S3 server (``start_moto``, ``Moto``), ``upload_tree``, and ``CountingProxy``,
  a recording, fault-injecting HTTP proxy in front of it.
- ``emulators``: fake-gcs-server and Azurite, started by the tests; ``https``: a certificate authority, a
  certificate it signs, and an HTTPS file server that can be told to fail.
- ``store_contract``: what every store must do, as test classes each store's tests subclass.
- ``browser``: a small DevTools client for headless Chromium.
- ``viewer``: Neuroglancer in that browser: its layers' load states, drawn frames, the gateway's access log.
- ``tree_names``: which metadata names belong at which level of each tree.
"""
