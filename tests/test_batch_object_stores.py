"""``index-segments`` and ``mesh-segments`` over a data root in object storage (moto's S3, Azurite), through the real
CLI: the index and the stored mesh set are written into the bucket beside the layer (the stamp last), block outputs
kept in the bucket too (a run that stopped resumes from them), and a real gateway over the bucket serves both.
"""

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
import wkw
from support.batch_runs import run_batch
from support.emulators import environment, start_azurite
from support.s3 import aws_environment, start_moto, upload_tree
from support.servers import Server, assert_reason

from gateway.batch.outputs import BlockOutputs
from gateway.batch.segment_index import SegmentIndexTask, SegmentLayer
from gateway.meshes.index import SegmentIndex
from gateway.meshes.segments import index_place
from gateway_storage import open_store

pytestmark = pytest.mark.slow  # object-store emulators, whole layers indexed and meshed

ORG, NAME, LAYER = "lab", "cells", "labels"
SHAPE = (128, 128, 64)
CELL, DUST_CELL = 5, 6  # a large segment, and one of 8 voxels that a dust threshold leaves out
CONTAINER = "batch"
_AZURE = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT")


def write_root(root: Path) -> None:
    labels = np.zeros((128, 128, 128), dtype=np.uint32)  # one raw file, written whole; the layer is its lower half
    x, y, z = np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij")
    labels[: SHAPE[0], : SHAPE[1], : SHAPE[2]][(x - 60) ** 2 + (y - 70) ** 2 + (z - 30) ** 2 < 25**2] = CELL
    labels[100:102, 10:12, 50:52] = DUST_CELL
    dataset = root / ORG / NAME
    with wkw.Dataset.open(str(dataset / LAYER / "1"), wkw.Header(np.uint32, block_type=1, file_len=4)) as ds:
        ds.write((0, 0, 0), labels)
    layer = {
        "name": LAYER,
        "category": "segmentation",
        "elementClass": "uint32",
        "dataFormat": "wkw",
        "boundingBox": {"topLeft": [0, 0, 0], "width": SHAPE[0], "height": SHAPE[1], "depth": SHAPE[2]},
        "mags": [{"mag": [1, 1, 1], "path": f"./{LAYER}/1"}],
        "largestSegmentId": DUST_CELL,
    }
    document = {"id": {"name": NAME, "team": ORG}, "scale": {"factor": [8, 8, 8]}, "dataLayers": [layer]}
    (dataset / "datasource-properties.json").write_text(json.dumps(document))


@dataclass(frozen=True)
class Bucket:
    url: str  # the data root
    exists: Callable[[str], bool]  # whether the object at a path below the root is there


@pytest.fixture(scope="module", params=["s3", "azure"])
def bucket(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bucket]:
    local = tmp_path_factory.mktemp("local-root")
    write_root(local)
    context: AbstractContextManager[None]
    if request.param == "s3":
        moto = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
        context = aws_environment(moto.endpoint)
        with context:
            client = moto.client()
            client.create_bucket(Bucket=CONTAINER)
            upload_tree(client, local, CONTAINER, "root")

            def s3_exists(path: str) -> bool:
                found = client.list_objects_v2(Bucket=CONTAINER, Prefix=f"root/{path}")
                return bool(found.get("KeyCount"))

            yield Bucket(f"s3://{CONTAINER}/root", s3_exists)
        moto.stop()
    else:
        azurite = start_azurite(tmp_path_factory.mktemp("azurite"))
        azurite.create_container(CONTAINER)
        with environment(azurite.env, cleared=_AZURE):
            azurite.upload_tree(local, CONTAINER, "root")
            container = azurite.service().get_container_client(CONTAINER)

            def azure_exists(path: str) -> bool:
                return any(True for _ in container.list_blobs(name_starts_with=f"root/{path}"))

            yield Bucket(f"az://{CONTAINER}/root", azure_exists)
        azurite.stop()


def run(command: str, root: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_batch(command, root, f"{ORG}/{NAME}", LAYER, *flags)


def kept(out: str) -> int:
    found = re.search(r"(\d+) blocks: (\d+) run on .*, (\d+) kept from an earlier run", out)
    assert found, out
    return int(found[3])


def test_an_index_and_a_mesh_set_are_written_to_the_bucket_resumed_and_served(
    bucket: Bucket, server_factory: Callable[..., Server]
) -> None:
    # A run that stopped after two of its blocks: their outputs lie in the bucket's work prefix.
    work = f"{bucket.url}/{ORG}/{NAME}/{LAYER}.batch-work"
    layer = SegmentLayer(bucket.url, ORG, NAME, LAYER)
    storage, meshes = layer.open()
    location = index_place(storage, None).location(meshes.dataset, LAYER)
    task = SegmentIndexTask(layer, storage, meshes, location, 1)
    outputs = BlockOutputs(work, task.name, task.version())
    for block in task.blocks()[:2]:
        outputs.write(block, task.run(block))
    assert bucket.exists(f"{ORG}/{NAME}/{LAYER}.batch-work/segment-index/")

    indexed = run("index-segments", bucket.url, "--block-cubes", "1", "--dust-threshold", "100")
    assert indexed.returncode == 0, indexed.stderr
    assert kept(indexed.stdout) == 2  # resumed from the outputs in the bucket
    assert not bucket.exists(f"{ORG}/{NAME}/{LAYER}.batch-work/"), "spent outputs are removed"
    found = open_store(bucket.url).read_whole(location, limit=1 << 30)
    assert found is not None
    index = SegmentIndex.from_bytes(found[0], location)
    assert index.ids.tolist() == [CELL] and index.stamp == task.stamp

    meshed = run("mesh-segments", bucket.url)
    assert meshed.returncode == 0, meshed.stderr
    assert bucket.exists(f"{ORG}/{NAME}/{LAYER}.meshes/stamp.json")
    assert bucket.exists(f"{ORG}/{NAME}/{LAYER}.meshes/info")

    server = server_factory(bucket.url, multires_voxels=1000)  # CELL is meshed only from a stored set
    base = f"{server.url}/data/meshes/{ORG}/{NAME}/{LAYER}/multires/"
    listed = requests.get(base + "segment_properties/info", timeout=120).json()
    assert listed["inline"]["ids"] == [str(CELL)]  # the bucket's index, with its dust threshold
    manifest = requests.get(f"{base}{CELL}.index", timeout=120)
    assert manifest.status_code == 200 and len(manifest.content) > 16, manifest.text
    # The set's stamp goes: the set is incomplete, and never served.
    open_store(bucket.url).delete(f"{bucket.url}/{ORG}/{NAME}/{LAYER}.meshes/stamp.json")
    for _ in range(60):
        answer = requests.get(f"{base}{CELL}.index", timeout=120)
        if answer.status_code != 200:
            break
        time.sleep(0.5)
    assert_reason(answer, 409, "mesh-segments")
