"""The gateway without the block check before a stored LZ4 block leaves: a benchmark-only build whose one
row shows what that check costs. The shipped gateway always checks (gateway/zarr/framing.py) and has no
setting to turn it off.

Run as ``python -m benchmark.unchecked serve ...`` with the gateway's own command line. uvicorn starts
its workers with multiprocessing's spawn, which imports this module again in each worker (as
``__mp_main__``), so every worker runs without the check too.
"""

from collections.abc import Hashable

from gateway.zarr import framing


def _not_checked(
    self: framing.Framing, data: framing.Stored, uncompressed_size: int, verdict_key: Hashable | None
) -> None:
    """Nothing: the block leaves as stored."""


framing.Lz4BlockFraming.check = _not_checked  # type: ignore[method-assign]

if __name__ == "__main__":
    from gateway.cli import main

    main()
