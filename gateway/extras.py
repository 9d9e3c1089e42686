"""The optional parts of the gateway, each a pip extra of the package, and the refusal when one is missing.

The core serves local data roots on uvicorn. A feature that needs more (a store URL as root, Granian, the
sample maker) imports its library only when it is used, through :meth:`Extra.require`, so that a missing
library stops start-up with a message that names the extra to install rather than an ImportError.
"""

import importlib
from dataclasses import dataclass


class MissingExtraError(ImportError):
    """A feature was asked for whose extra is not installed; the message says what to install."""


@dataclass(frozen=True, slots=True)
class Extra:
    name: str  # as in ``pip install 'zarr-gateway[name]'``
    modules: tuple[str, ...]  # what the feature imports

    def require(self, feature: str) -> None:
        """Import the extra's modules, or raise :class:`MissingExtraError` naming ``feature`` and the extra."""
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise MissingExtraError(
                    f"{feature} needs the {self.name!r} extra, which is not installed ({exc}): "
                    f"pip install 'zarr-gateway[{self.name}]'"
                ) from None


S3 = Extra("s3", ("boto3", "botocore", "obstore"))  # obstore: an s3:// remote root
GCS = Extra("gcs", ("obstore",))
AZURE = Extra("azure", ("obstore",))
HTTPS = Extra("https", ("obstore",))
GRANIAN = Extra("granian", ("granian",))
SAMPLE = Extra("sample", ("rich",))
MESHES = Extra("meshes", ("zmesh", "DracoPy", "rich"))
PRECOMPUTED = Extra("precomputed", ("compressed_segmentation",))  # else segmentations are served raw

# By name, as gateway_storage.STORE_KINDS names the extra of each store.
EXTRAS = {extra.name: extra for extra in (S3, GCS, AZURE, HTTPS, GRANIAN, SAMPLE, MESHES, PRECOMPUTED)}
