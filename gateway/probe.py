"""Container health probe: ``python -m gateway.probe [readyz|healthz]`` exits 0 when the local gateway answers 200.

It imports nothing of the gateway, so a probe never touches the metrics files of the running workers.
"""

import os
import sys
import urllib.request


def probe(endpoint: str = "readyz") -> int:
    port = os.environ.get("ZARR_GATEWAY_PORT", "8000")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{endpoint}", timeout=5) as response:
            return 0 if response.status == 200 else 1
    except Exception as exc:
        print(f"{endpoint}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(probe(*sys.argv[1:2]))
