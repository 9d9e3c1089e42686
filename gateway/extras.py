"""The optional parts of the gateway, each a pip extra of the package, and the refusal when one is missing.

The core serves local data roots on uvicorn. A feature that needs more (a store URL as root, Granian, the
sample maker, meshes, the bundled viewer) imports its library only when it is used, through
:meth:`Extra.require`, so that a missing library stops start-up with a message that names the extra to
install rather than an ImportError. Start-up says which features are off (:meth:`Extra.missing`).
"""

import importlib
import importlib.util
from dataclasses import dataclass

from gateway_storage.faults import Unsupported


class MissingExtraError(Unsupported, ImportError):
    """A feature was asked for whose extra is not installed; the message says what to install."""


@dataclass(frozen=True, slots=True)
class Extra:
    name: str  # as in ``pip install 'zarr-gateway[name]'``
    modules: tuple[str, ...]  # what the feature imports
    provides: str  # what is off without it, as start-up says so

    def missing(self) -> str | None:
        """Which of the extra's modules is not installed, or None when all are: found without importing them
        (the viewer's package takes over a second to import), so that start-up can ask about every extra."""
        for module in self.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError as exc:
                return str(exc)
            if not found:
                return f"No module named {module!r}"
        return None

    def install_hint(self) -> str:
        return f"pip install 'zarr-gateway[{self.name}]'"

    @property
    def available(self) -> bool:
        """Whether every module of the extra is installed (found, not imported): a feature whose extra is missing
        is not advertised (no mesh source in a viewer link, no link to a viewer the gateway cannot serve)."""
        return self.missing() is None

    def require(self, feature: str) -> None:
        """Import the extra's modules, or raise :class:`MissingExtraError` naming ``feature`` and the extra."""
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise MissingExtraError(
                    f"{feature} needs the {self.name!r} extra, which is not installed ({exc}): {self.install_hint()}"
                ) from None


S3 = Extra("s3", ("obstore",), "s3:// data and remote roots")
GCS = Extra("gcs", ("obstore",), "gs:// data and remote roots")
AZURE = Extra("azure", ("obstore",), "az:// data and remote roots")
HTTPS = Extra("https", ("obstore",), "https:// data and remote roots")
GRANIAN = Extra("granian", ("granian",), "server=granian")
SAMPLE = Extra("sample", ("rich",), "zarr-gateway make-sample")
MESHES = Extra("meshes", ("zmesh", "DracoPy", "tinybrain", "rich"), "segment meshes and zarr-gateway index-segments")
BATCH = Extra("batch", ("distributed",), "zarr-gateway index-segments on dask.distributed (--workers, --scheduler)")
VIEWER = Extra("viewer", ("neuroglancer",), "the Neuroglancer client served at /neuroglancer/")
PRECOMPUTED = Extra(
    "precomputed", ("compressed_segmentation",), "compressed_segmentation chunks of the precomputed tree (else raw)"
)
OIDC = Extra("oidc", ("jwt", "cryptography"), "sign-in with OpenID Connect (oidc_issuer)")
MAPPINGS = Extra("mappings", ("h5py",), "agglomerate mappings stored as HDF5 files (mapped segmentation layers)")

# By name, as gateway_storage.STORE_KINDS names the extra of each store; ``all`` in pyproject.toml names each.
EXTRAS = {
    extra.name: extra
    for extra in (S3, GCS, AZURE, HTTPS, GRANIAN, SAMPLE, MESHES, BATCH, VIEWER, PRECOMPUTED, MAPPINGS, OIDC)
}
