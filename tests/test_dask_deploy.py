"""The dask cluster of deploy/kubernetes/components/dask, checked without a cluster, as docs/distributed.md adds
it: to the shared-filesystem overlay. Rendered by kubectl's kustomize, validated against current Kubernetes
schemas, scanned by checkov, and its numbers checked against what ``index-segments`` states."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
import wkw
import yaml
from support.kubectl import kubectl
from support.layers import write_properties

from gateway.batch.runner import WORKER_HEADROOM_BYTES
from gateway.batch.segment_index import SegmentLayer
from gateway.meshes.build import BLOCK_CUBES, box_memory_bytes

REPO = Path(__file__).resolve().parent.parent
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
DASK = {"dask-scheduler", "dask-worker", "dask-client"}
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tree = tmp_path_factory.mktemp("dask-deploy") / "kubernetes"
    shutil.copytree(REPO / "deploy" / "kubernetes", tree)
    overlay = tree / "overlays" / "shared-filesystem"
    (overlay / "tokens.json").write_text(json.dumps({"tokens": {}}))
    with (overlay / "kustomization.yaml").open("a") as out:
        out.write("\ncomponents:\n  - ../../components/dask\n")
    built = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def the(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def dask_workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] in ("Deployment", "Job")
        and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") in DASK
    ]


def size_bytes(text: str) -> int:
    found = re.fullmatch(r"(\d+)([KMG]i(?:B)?)", text)
    assert found, text
    return int(found.group(1)) * UNITS[found.group(2)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_for_current_kubernetes(rendered: list[dict[str, Any]], version: str) -> None:
    for doc in rendered:
        if doc["kind"] == "ServiceMonitor":
            continue
        kubernetes_validate.validate(doc, version, strict=True)
    assert len(dask_workloads(rendered)) == 3


def test_the_workers_and_the_job_reach_the_scheduler_through_its_service(rendered: list[dict[str, Any]]) -> None:
    service = the(rendered, "Service", "dask-scheduler")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "scheduler")
    address = f"tcp://{service['metadata']['name']}:{port}"
    selected = [
        d
        for d in rendered
        if d["kind"] == "Deployment"
        and all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())
    ]
    assert [d["metadata"]["name"] for d in selected] == ["dask-scheduler"]
    worker = pod_spec(the(rendered, "Deployment", "dask-workers"))["containers"][0]
    assert worker["command"][-1] == address
    job = pod_spec(the(rendered, "Job", "zarr-gateway-index-segments"))["containers"][0]
    assert job["args"][0] == "index-segments" and f"--scheduler={address}" in job["args"]
    assert the(rendered, "Job", "zarr-gateway-index-segments")["spec"]["suspend"] is True


def test_the_workers_and_the_job_see_the_data_read_only_and_the_work_claim_at_the_same_paths(
    rendered: list[dict[str, Any]],
) -> None:
    claims = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "PersistentVolumeClaim"}
    assert claims["zarr-gateway-batch-work"]["spec"]["accessModes"] == ["ReadWriteMany"]
    for name, kind in (("dask-workers", "Deployment"), ("zarr-gateway-index-segments", "Job")):
        spec = pod_spec(the(rendered, kind, name))
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
        data, work = volumes[mounts["/data"]["name"]], volumes[mounts["/work"]["name"]]
        assert data["persistentVolumeClaim"]["claimName"] == "zarr-gateway-data" in claims
        assert mounts["/data"].get("readOnly") is True and data["persistentVolumeClaim"].get("readOnly") is True
        assert work["persistentVolumeClaim"]["claimName"] == "zarr-gateway-batch-work"
    args = pod_spec(the(rendered, "Job", "zarr-gateway-index-segments"))["containers"][0]["args"]
    assert args[1] == "/data" and "--work-dir=/work/batch" in args and "--segment-index-dir=/work/indexes" in args


def test_a_worker_pod_holds_one_block_of_uint32_labels_as_index_segments_states_it(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """One process of one thread per pod; its dask memory limit holds a block (the bound the command states,
    of a uint32 layer in the default blocks) and the worker process, and lies under the container's limit."""
    dataset = tmp_path / "org" / "labels"
    with wkw.Dataset.open(str(dataset / "seg" / "1"), wkw.Header(np.uint32, block_type=2, file_len=4)) as ds:
        ds.write((0, 0, 0), np.ones((128, 128, 128), dtype=np.uint32))
    layer = {
        "name": "seg",
        "category": "segmentation",
        "boundingBox": {"topLeft": [0, 0, 0], "width": 1000, "height": 1000, "depth": 1000},
        "elementClass": "uint32",
        "dataFormat": "wkw",
        "mags": [{"mag": [1, 1, 1], "path": "./seg/1"}],
    }
    write_properties(dataset, [layer])
    _, meshes = SegmentLayer(str(tmp_path), "org", "labels", "seg").open()
    block = box_memory_bytes(meshes.grid, BLOCK_CUBES)
    container = pod_spec(the(rendered, "Deployment", "dask-workers"))["containers"][0]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])
    assert flags["nworkers"] == "1" and flags["nthreads"] == "1"
    limit = size_bytes(flags["memory-limit"])
    assert block + WORKER_HEADROOM_BYTES <= limit < size_bytes(container["resources"]["limits"]["memory"])
    stated = re.search(
        r"(\d+) MiB for\s*\n?#?\s*uint32 labels", (REPO / "deploy/kubernetes/components/dask/workers.yaml").read_text()
    )
    assert stated and int(stated.group(1)) == round(block / 2**20), "the comment states the bound the command does"


def test_the_dask_pods_are_locked_down_and_bounded(rendered: list[dict[str, Any]]) -> None:
    for doc in dask_workloads(rendered):
        spec = pod_spec(doc)
        assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_only_dask_pods_reach_dask_pods(rendered: list[dict[str, Any]]) -> None:
    policy = the(rendered, "NetworkPolicy", "dask")
    [expression] = policy["spec"]["podSelector"]["matchExpressions"]
    assert set(expression["values"]) == DASK
    [rule] = policy["spec"]["ingress"]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"} and set(peer["podSelector"]["matchExpressions"][0]["values"]) == DASK


def accepted_checks() -> set[str]:
    """The checkov checks the README's Kubernetes section accepts (each with its reason there)."""
    section = (REPO / "README.md").read_text().split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(CKV\w+)` \| [^|]+ \| [^|]+ \|$", section, re.MULTILINE))


@pytest.mark.checkov
def test_checkov_fails_no_check_on_the_dask_objects_but_those_the_readme_accepts(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    installed = subprocess.run([str(REPO / "scripts" / "security-tools")], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-2000:]
    checkov = installed.stdout.strip().splitlines()[-1]
    (tmp_path / "dask.yaml").write_text(yaml.safe_dump_all(rendered))
    command = [checkov, "-d", str(tmp_path), "--framework", "kubernetes", "--skip-download", "--output", "json"]
    run = subprocess.run(
        [*command, "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
        timeout=600,
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["summary"]["passed"] > 100, "checkov ran hardly any check"
    failed = {(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]}
    assert {check for check, _ in failed} <= accepted_checks(), failed
