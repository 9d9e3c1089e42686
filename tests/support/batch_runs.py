"""The batch commands (``index-segments``, ``mesh-segments``) run as a user runs them: a process of their own,
without the settings of the environment the tests run in."""

import os
import subprocess
import sys

RUN_SECONDS = 600


def run_batch(command: str, root: str, dataset: str, layer: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``zarr-gateway COMMAND ROOT DATASET LAYER FLAGS``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", command, root, dataset, layer, *flags],
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        env={k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")},
    )
