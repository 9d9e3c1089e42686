"""What belongs where: the metadata names every level of every tree answers (all others are a 404 there)."""

PROPERTIES = "datasource-properties.json"
METADATA = (".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json", PROPERTIES)
LEVELS = ("tree", "organization", "dataset", "group", "array")
# What belongs where: the table every client relies on (a name not listed for a level is a 404 there).
BELONGS: dict[str, dict[str, set[str]]] = {
    "zarr": {
        "tree": set(),
        "organization": set(),
        "dataset": {PROPERTIES, ".zgroup", ".zattrs", ".zmetadata"},
        "group": {".zgroup", ".zattrs", ".zmetadata"},
        "array": {".zarray", ".zattrs"},
    },
    "zarr3": {
        "tree": set(),
        "organization": set(),
        "dataset": {PROPERTIES, "zarr.json"},
        "group": {"zarr.json"},
        "array": {"zarr.json"},
    },
    "zarr3_experimental": {  # webKnossos' older name of the zarr3 tree
        "tree": set(),
        "organization": set(),
        "dataset": {PROPERTIES, "zarr.json"},
        "group": {"zarr.json"},
        "array": {"zarr.json"},
    },
    "xarray": {
        "tree": set(),
        "organization": set(),
        "dataset": {"zarr.json"},
        "group": {"zarr.json"},
        "array": {"zarr.json"},
    },
}
