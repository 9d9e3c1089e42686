"""``zarr-gateway make-sample``: the sample dataset and its segment index."""

import argparse
from pathlib import Path

from ..extras import MESHES, MissingExtraError
from .errors import CommandError
from .index_segments import INDEX_RUN_DEFAULTS, index_segments


def make_sample(args: argparse.Namespace) -> None:
    from ..sample import DATASET, ORGANIZATION
    from ..sample import make_sample as write_sample

    root = Path(args.directory)
    existing = root / ORGANIZATION / DATASET
    if existing.exists() and not args.overwrite:
        raise CommandError(f"make-sample: {existing} already exists; pass --overwrite to write it again")
    if root.exists() and not root.is_dir():
        raise CommandError(f"make-sample: {root} is not a directory")
    try:
        path = write_sample(root)
    except MissingExtraError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"make-sample: cannot write into {root}: {exc.strerror or exc}") from None
    print(f"sample dataset written to {path}")
    if MESHES.missing() is not None:  # no meshes are served, so no index is needed for them
        print(f"no segment index written: meshes need the {MESHES.name!r} extra ({MESHES.install_hint()})")
        return
    # Its segment index, so that the dataset page opens Neuroglancer with the largest cells selected.
    index_segments(
        argparse.Namespace(
            root=args.directory,
            dataset=f"{path.parent.name}/{path.name}",
            layer="segmentation",
            segment_index_dir=None,
            **INDEX_RUN_DEFAULTS,
        )
    )


def add_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    sample = commands.add_parser(
        "make-sample",
        help="write a small sample dataset (color and segmentation layers) into DIRECTORY",
        description="Write the sample dataset DIRECTORY/sample_org/sample_dataset and its segment index.",
    )
    sample.add_argument(
        "directory", metavar="DIRECTORY", help="the data root to write into (made if missing), e.g. sample-data"
    )
    sample.add_argument("--overwrite", action="store_true", help="write the sample again where one exists")
    sample.set_defaults(func=make_sample)
