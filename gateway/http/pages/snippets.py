"""Code that reads a dataset with each client, from the templates in ``snippets/`` (``string.Template``)."""

import json
from dataclasses import dataclass
from string import Template

from .markup import path_of, resource

TOKEN_PLACEHOLDER = "<token>"
# The data-client attribute of each snippet (its template's name) and its title.
CLIENTS = {
    "zarr-python": "zarr-python (Zarr v2 tree)",
    "tensorstore": "tensorstore (Zarr v3 tree)",
    "webknossos": "webknossos-libs",
    "xarray": "xarray",
}
# What each snippet needs installed, its first line (the README's client sections give the same lines):
# zarr alone cannot open an http:// URL, xarray reads through zarr and dask.
INSTALL = {
    "zarr-python": "pip install 'zarr>=3' fsspec aiohttp requests",
    "tensorstore": "pip install tensorstore",
    "webknossos": "pip install webknossos",
    "xarray": "pip install xarray dask 'zarr>=3' fsspec aiohttp requests",
}


@dataclass(frozen=True, slots=True)
class Snippet:
    client: str  # the data-client attribute: zarr-python, tensorstore, webknossos, xarray
    title: str
    code: str


def snippets(
    public_base: str, organization: str, dataset: str, first_layer: str, finest_mag: str, needs_token: bool
) -> tuple[Snippet, ...]:
    """Code that reads this dataset with each client, its install line first, with ``<token>`` where the gateway
    needs a token."""
    layer_path = path_of(organization, dataset, first_layer)
    token = json.dumps(TOKEN_PLACEHOLDER)
    with_token = {
        "zarr_options": f', storage_options={{"headers": {{"X-Auth-Token": {token}}}}}',
        "tensorstore_headers": f'\n        "headers": ["X-Auth-Token: {TOKEN_PLACEHOLDER}"],',
        "upath_options": f', headers={{"X-Auth-Token": {token}}}',
        "xarray_options": f'\noptions = {{"headers": {{"X-Auth-Token": {token}}}}}',
        "xarray_kwargs": ", storage_options=options",
    }
    values = {
        "zarr_url": f"{public_base}/data/zarr/{layer_path}/{finest_mag}",
        "zarr3_url": f"{public_base}/data/zarr3/{layer_path}/{finest_mag}/",
        "dataset_url": f"{public_base}/data/zarr/{path_of(organization, dataset)}",
        "xarray_url": f"{public_base}/data/xarray/{path_of(organization, dataset)}",
        "layer_literal": json.dumps(first_layer),
        "mag_literal": json.dumps(finest_mag),
        "finest_mag": finest_mag,
        **{name: value if needs_token else "" for name, value in with_token.items()},
    }
    return tuple(
        Snippet(
            client, title, f"# {INSTALL[client]}\n" + Template(resource(f"snippets/{client}.tmpl")).substitute(values)
        )
        for client, title in CLIENTS.items()
    )
