"""igneous's side of ``scripts/bench-meshes --igneous``, run in igneous's own venv (``scripts/side-venv
igneous-venv igneous-pipeline==...``) as ``python -m benchmark.igneous_side``: nothing else of the benchmark
is imported there.

``write PATH LABELS.npy RESOLUTION``: the labels as a local precomputed segmentation (CloudVolume, chunks of
64³, compressed_segmentation), igneous's input. ``mesh PATH WORKERS TASK_EDGE LODS``: igneous's sharded
multi-resolution meshing of it, as its documentation runs it on one machine: meshing tasks (sharded fragments
and the spatial index), then the merge into multi-resolution shards, both on a ``LocalTaskQueue`` of
``WORKERS`` processes, with igneous's default simplification.
"""

import sys

import numpy as np

CHUNK = (64, 64, 64)


def write(path: str, labels_file: str, resolution: str) -> None:
    from cloudvolume import CloudVolume

    labels = np.load(labels_file)
    info = CloudVolume.create_new_info(
        num_channels=1,
        layer_type="segmentation",
        data_type=str(labels.dtype),
        encoding="compressed_segmentation",
        resolution=[float(r) for r in resolution.split(",")],
        voxel_offset=[0, 0, 0],
        chunk_size=list(CHUNK),
        volume_size=list(labels.shape),
    )
    volume = CloudVolume(f"file://{path}", info=info, progress=False)
    volume.commit_info()
    volume[:, :, :] = labels


def mesh(path: str, workers: int, task_edge: int, lods: int) -> None:
    import igneous.task_creation as tc
    from taskqueue import LocalTaskQueue

    queue = LocalTaskQueue(parallel=workers, progress=False)
    cloudpath = f"file://{path}"
    queue.insert(tc.create_meshing_tasks(cloudpath, mip=0, shape=(task_edge,) * 3, sharded=True), progress=False)
    queue.execute(progress=False)
    queue.insert(tc.create_sharded_multires_mesh_tasks(cloudpath, num_lod=lods, progress=False), progress=False)
    queue.execute(progress=False)


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "write":
        write(*args)
    elif command == "mesh":
        mesh(args[0], int(args[1]), int(args[2]), int(args[3]))
    else:
        raise SystemExit(f"unknown command {command!r}: write or mesh")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
