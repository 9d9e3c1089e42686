"""``zarr-gateway mesh-segments``: the stored multi-resolution mesh set of one segmentation layer."""

import argparse
import posixpath

from .batch import add_batch_arguments, batch_root, require_batch_extras, run_blocks, segment_selection
from .errors import CommandError


def mesh_segments(args: argparse.Namespace) -> None:
    """Make the stored multi-resolution mesh set of one segmentation layer (see gateway/meshes/stored.py), which
    the gateway serves for every segment, those too large to mesh on demand included."""
    command = "mesh-segments"
    require_batch_extras(command, args)
    from ..batch.mesh_sets import MeshSetTask
    from ..batch.segment_index import DatasetNotFound
    from ..meshes.errors import MeshInputError, MeshNotFound, SegmentIndexRequired
    from ..meshes.stored import MeshSetBlockFailed

    root = batch_root(command, args)
    selection = segment_selection(command, args)
    try:
        task = MeshSetTask.for_layer(root, args.dataset, args.layer, args.segment_index_dir or None, selection)
    except SegmentIndexRequired as exc:
        raise CommandError(f"{command}: --dust-threshold needs the layer's voxel counts: {exc}") from None
    except (MeshInputError, MeshNotFound, DatasetNotFound, MeshSetBlockFailed) as exc:
        raise CommandError(f"{command}: {exc}") from None
    summary = run_blocks(command, args, task, posixpath.dirname(task.directory), keep_going=True)
    print(
        f"the meshes of {args.dataset}/{args.layer} made in {summary.seconds:.1f} s "
        f"({summary.voxels_per_second / 1e6:.1f} M voxels/s), written to {summary.result}"
    )
    for line in summary.lines():
        print(f"  {line}")
    left_out = [f"  block {f.key}: {f.reason}" for f in summary.failed] + [
        f"  segment {s.segment} at level {s.lod} {list(s.position)}: {s.reason}" for s in task.skipped
    ]
    if left_out:
        print(
            f"left out of the set ({len(summary.failed)} blocks, {len(task.skipped)} fragments):", *left_out, sep="\n"
        )
        if args.strict:
            raise CommandError(f"{command}: {len(left_out)} parts of the layer could not be meshed (--strict)")


def add_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    meshes = commands.add_parser(
        "mesh-segments",
        help="make the multi-resolution meshes of every segment of a layer, for the gateway to serve as stored",
        description="Make the multi-resolution meshes of every segment of a segmentation layer (Neuroglancer's "
        "sharded format), for the gateway to serve as stored: segments too large to mesh on demand included.",
    )
    add_batch_arguments(meshes, "the mesh set")
    meshes.add_argument(
        "--strict",
        action="store_true",
        help="exit non-zero when a block or a segment's fragment could not be meshed (by default the set is "
        "finished without them, and they are listed)",
    )
    meshes.set_defaults(func=mesh_segments)
