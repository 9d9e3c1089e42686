"""``zarr-gateway index-segments``: the segment index of one segmentation layer."""

import argparse
import posixpath
from typing import Any

from .batch import add_batch_arguments, batch_root, require_batch_extras, run_blocks, segment_selection
from .errors import CommandError

# How index-segments runs unless told otherwise: in this process, blocks of the meshes' default size.
INDEX_RUN_DEFAULTS: dict[str, Any] = {"workers": None, "scheduler": None, "work_dir": None, "block_cubes": None}


def index_segments(args: argparse.Namespace) -> None:
    """Build the segment index of one segmentation layer (see gateway/meshes/index.py), block by block in this
    process or on dask.distributed (gateway/batch); a run started again resumes from the blocks it finished."""
    command = "index-segments"
    require_batch_extras(command, args)
    from ..batch.segment_index import DatasetNotFound, SegmentIndexTask, SegmentLayer
    from ..meshes.build import BLOCK_CUBES
    from ..meshes.errors import MeshInputError, MeshNotFound, MeshTooLarge
    from ..meshes.segments import index_place

    root = batch_root(command, args)
    block_cubes = BLOCK_CUBES if args.block_cubes is None else args.block_cubes
    if block_cubes < 1:
        raise CommandError(f"{command}: --block-cubes {args.block_cubes}: at least one cube per edge")
    organization, _, name = args.dataset.partition("/")
    layer = SegmentLayer(root, organization, name, args.layer)
    try:
        storage, meshes = layer.open()
        place = index_place(storage, args.segment_index_dir or None)
        location = place.location(meshes.dataset, args.layer)
        selection = segment_selection(command, args)
        task = SegmentIndexTask(layer, storage, meshes, location, block_cubes, selection, place.store)
    except MeshTooLarge as exc:  # no fragment of it could be made either: an index would serve nothing
        raise CommandError(f"{command}: layer {args.layer!r} cannot be indexed: {exc}") from None
    except (MeshInputError, MeshNotFound, DatasetNotFound) as exc:
        raise CommandError(f"{command}: {exc}") from None
    summary = run_blocks(command, args, task, posixpath.dirname(location))
    print(
        f"{task.segments} segments of {args.dataset}/{args.layer} indexed in {summary.seconds:.1f} s "
        f"({summary.voxels_per_second / 1e6:.1f} M voxels/s), written to {summary.result}"
    )
    for line in summary.lines():
        print(f"  {line}")


def add_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    index = commands.add_parser(
        "index-segments",
        help="index which cubes hold each segment of a segmentation layer, for its meshes",
        description="Index which cubes hold each segment of a segmentation layer, for its meshes.",
    )
    add_batch_arguments(index, "the index")
    index.add_argument(
        "--block-cubes",
        dest="block_cubes",
        type=int,
        default=INDEX_RUN_DEFAULTS["block_cubes"],
        metavar="K",
        help="level-0 cubes (64 voxels) per edge of a block, one task each (default: blocks of a few hundred MiB "
        "at most; larger blocks make fewer tasks that each hold more memory)",
    )
    index.set_defaults(func=index_segments)
