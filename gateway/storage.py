"""Where datasets live: a local directory or an S3 bucket prefix, behind one interface.

Paths are strings in the storage's own namespace (absolute local paths, or
object keys). Everything a source reads goes through here, so containment in
the data root and the mapping of store faults (FileChanged, Unavailable) are
decided in one place.
"""

import os
import posixpath
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlparse

from wkw_adapter import FileChangedError, FileIdentity, LocalStore, StoreUnavailableError, TruncatedFileError
from wkw_adapter.storage import resolve_inside

from .extras import S3


class Storage(Protocol):
    is_local: bool
    root: str

    def join(self, base: str, *parts: str) -> str: ...

    def resolve(self, path: str) -> str | None:
        """``path`` in canonical form if it lies inside the data root (or another trusted root), else None."""
        ...

    def root_of(self, path: str) -> str:
        """The trusted root a canonical path lies under: paths relative to it are the same on every replica."""
        ...

    def identity(self, path: str) -> FileIdentity | None: ...

    def read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool = True) -> bytes: ...

    def read_whole(self, path: str) -> tuple[bytes, FileIdentity] | None:
        """A small file (metadata) with its identity, or None if it does not exist."""
        ...

    def list_directories(self, path: str) -> list[str]:
        """Names of the sub-directories (object prefixes) of ``path``, sorted."""
        ...

    def is_directory(self, path: str) -> bool: ...

    def kvstore(self, path: str) -> dict[str, Any]:
        """A tensorstore kvstore spec for the directory ``path``."""
        ...


def _plain(name: str) -> bool:
    return bool(name) and not name.startswith(".")


class LocalStorage(LocalStore):
    """A directory on a local (or network-mounted) file system, plus other trusted directories.

    ``extra_roots`` are further directories that layers may be symlinked to (a second volume, as
    webKnossos data roots often have); every path outside all the roots is still refused. Data files
    are served once they have been quiet for ``settle_seconds`` (see LocalStore; the server takes it
    from its settings, other callers trust every file unless they ask).
    """

    def __init__(self, root: str, extra_roots: Sequence[str] = (), settle_seconds: float = 0.0) -> None:
        super().__init__(root, extra_roots=extra_roots, settle_seconds=settle_seconds)
        self.root: str = os.path.realpath(root)

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def resolve(self, path: str) -> str | None:
        return resolve_inside(self.roots, path)

    def read_whole(self, path: str) -> tuple[bytes, FileIdentity] | None:
        # Metadata is read whole and parsed: a torn copy does not parse, and its dataset is looked at
        # again soon (the catalog reloads datasets with problems), so it is not held to the settle rule.
        for _ in range(3):
            identity = self.identity(path)
            if identity is None:
                return None
            try:
                return self.read(path, 0, identity.size, identity, settled=False), identity
            except (FileChangedError, TruncatedFileError):
                continue
        raise FileChangedError(f"{path} keeps changing while it is read")

    def list_directories(self, path: str) -> list[str]:
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e.name for e in entries if _plain(e.name) and e.is_dir())

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(path)

    def kvstore(self, path: str) -> dict[str, Any]:
        return {"driver": "file", "path": path.rstrip("/") + "/"}


class S3Storage:
    """A bucket prefix in S3-compatible object storage, read with ranged GETs.

    Credentials, region and endpoint come from the usual AWS environment
    variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``) unless given. Transient faults are
    retried with backoff by botocore; what still fails is StoreUnavailableError.
    Every ranged GET carries ``If-Match`` with the ETag it expects, so bytes
    and identity always belong to the same version of an object.
    """

    is_local = False

    def __init__(self, url: str, endpoint_url: str | None = None, timeout: float = 10.0, max_attempts: int = 4) -> None:
        S3.require("an s3:// data root")
        import boto3
        from botocore.config import Config

        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"{url!r} is not an s3://bucket/prefix URL")
        self.bucket = parsed.netloc
        self.root = parsed.path.strip("/")
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.max_attempts = max_attempts
        config = Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"mode": "standard", "max_attempts": max_attempts},
            max_pool_connections=64,
        )
        self.client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts) if base else posixpath.join(*parts)

    def resolve(self, path: str) -> str | None:
        normal = posixpath.normpath(path).lstrip("/")
        if normal == self.root or not self.root or normal.startswith(self.root + "/"):
            return normal
        return None

    def root_of(self, path: str) -> str:
        return self.root

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = exc.response.get("Error", {}).get("Code", "")
            if status in (404, 412) or code in ("NoSuchKey", "404", "PreconditionFailed"):
                raise
            if status >= 500 or status in (0, 429):
                raise StoreUnavailableError(f"s3://{self.bucket}: {operation} failed: {code or status}") from exc
            raise OSError(f"s3://{self.bucket}: {operation} refused: {code} ({status})") from exc
        except BotoCoreError as exc:
            raise StoreUnavailableError(f"s3://{self.bucket}: {operation} failed: {exc}") from exc

    @staticmethod
    def _status(exc: Exception) -> int:
        return getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)

    def identity(self, path: str) -> FileIdentity | None:
        from botocore.exceptions import ClientError

        try:
            head = self._call("head_object", Key=path)
        except ClientError as exc:
            if self._status(exc) == 404:
                return None
            raise
        return FileIdentity(head["ContentLength"], head["ETag"], head["LastModified"].timestamp())

    def read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool = True) -> bytes:
        """A ranged GET with If-Match: an object is replaced whole, so every version is settled."""
        from botocore.exceptions import ClientError

        if size == 0:
            return b""
        try:
            answer = self._call(
                "get_object", Key=path, Range=f"bytes={offset}-{offset + size - 1}", IfMatch=expected.version
            )
            data = answer["Body"].read()
        except ClientError as exc:
            raise FileChangedError(f"s3://{self.bucket}/{path} changed or vanished while it was being read") from exc
        except OSError as exc:
            raise StoreUnavailableError(f"s3://{self.bucket}/{path}: read failed: {exc}") from exc
        if len(data) != size:
            raise TruncatedFileError(f"s3://{self.bucket}/{path}: wanted {size} bytes at {offset}, got {len(data)}")
        return data

    def read_whole(self, path: str) -> tuple[bytes, FileIdentity] | None:
        from botocore.exceptions import ClientError

        try:
            answer = self._call("get_object", Key=path)
            data = answer["Body"].read()
        except ClientError as exc:
            if self._status(exc) == 404:
                return None
            raise
        return data, FileIdentity(len(data), answer["ETag"], answer["LastModified"].timestamp())

    def list_directories(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/" if path else ""
        names = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    name = common["Prefix"][len(prefix) :].rstrip("/")
                    if _plain(name):
                        names.append(name)
        except Exception as exc:
            raise StoreUnavailableError(f"s3://{self.bucket}/{prefix}: listing failed: {exc}") from exc
        return sorted(names)

    def is_directory(self, path: str) -> bool:
        answer = self._call("list_objects_v2", Prefix=path.rstrip("/") + "/", MaxKeys=1)
        return answer.get("KeyCount", 0) > 0

    def kvstore(self, path: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"driver": "s3", "bucket": self.bucket, "path": path.rstrip("/") + "/"}
        spec["aws_region"] = self.region
        if self.endpoint_url:
            spec["endpoint"] = self.endpoint_url
        # tensorstore's default (32 retries, up to 32 s apart) would hold a request for many minutes while
        # the store is down; retry about as long as botocore does above, then answer (503).
        retries = {"max_retries": self.max_attempts - 1, "initial_delay": "0.1s", "max_delay": "2s"}
        spec["context"] = {"s3_request_retries": retries}
        return spec


def open_storage(root: str, extra_roots: Sequence[str] = (), settle_seconds: float = 0.0) -> Storage:
    """A local path or ``file://`` URL (with its extra trusted roots), or an ``s3://bucket/prefix`` URL.

    Objects in a bucket are replaced whole and read with If-Match, so neither option applies there.
    """
    if root.startswith("s3://"):
        return S3Storage(root)
    return LocalStorage(root.removeprefix("file://"), extra_roots, settle_seconds)
