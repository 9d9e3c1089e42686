"""One mesh fragment read as Neuroglancer finds it: info, segment properties, manifest, then the fragment."""

from typing import Any

import requests


def read_a_mesh_fragment(
    url: str, dataset: str = "sample_org/sample_dataset", layer: str = "segmentation", **headers: str
) -> bytes:
    """The first legacy fragment of the first listed segment under the gateway at ``url``; asserts each step."""
    base = f"{url}/data/meshes/{dataset}/{layer}/legacy/"

    def get(path: str) -> requests.Response:
        answer = requests.get(base + path, headers=headers, timeout=120)
        assert answer.status_code == 200, (base + path, answer.status_code, answer.text[:300])
        return answer

    info: dict[str, Any] = get("info").json()
    assert info["@type"] == "neuroglancer_legacy_mesh", info
    ids = get(f"{info['segment_properties']}/info").json()["inline"]["ids"]
    assert ids, "no segment is listed"
    fragments = get(f"{ids[0]}:0").json()["fragments"]
    assert fragments, f"segment {ids[0]} has no fragment"
    body = get(fragments[0]).content
    assert body, f"fragment {fragments[0]} is empty"
    return body
