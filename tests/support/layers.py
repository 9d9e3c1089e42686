"""A dataset's ``datasource-properties.json`` for tests that plant one kind of file per layer."""

import json
from pathlib import Path
from typing import Any


def layer_entry(name: str, data_format: str, size: tuple[int, int, int] = (64, 64, 64)) -> dict[str, Any]:
    """A uint8 color layer of one mag, ``./<name>/1``, whose bounding box is ``size`` from the origin."""
    return {
        "name": name,
        "category": "color",
        "boundingBox": {"topLeft": [0, 0, 0], "width": size[0], "height": size[1], "depth": size[2]},
        "elementClass": "uint8",
        "dataFormat": data_format,
        "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
    }


def write_properties(dataset: Path, layers: list[dict[str, Any]]) -> None:
    """The dataset directory with a properties file naming ``layers``."""
    dataset.mkdir(parents=True, exist_ok=True)
    document = {"id": {"name": dataset.name, "team": ""}, "scale": {"factor": [1, 1, 1], "unit": "nanometer"}}
    (dataset / "datasource-properties.json").write_text(json.dumps({**document, "dataLayers": layers}))
