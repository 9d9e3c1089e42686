"""A bucket prefix in S3-compatible object storage as a store. boto3 is imported here only, when one is opened."""

import os
import posixpath
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from .errors import FileChangedError, OutsideRootError, StoreUnavailableError, TruncatedFileError
from .identity import FileIdentity
from .store import Store, is_listed, refuse_oversized


class S3Store(Store):
    """A bucket prefix in S3-compatible object storage, read with ranged GETs.

    Credentials, region and endpoint come from the usual AWS environment
    variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``) unless given. Transient faults are
    retried with backoff by botocore; what still fails is StoreUnavailableError.
    Every ranged GET carries ``If-Match`` with the ETag it expects, so bytes
    and identity always belong to the same version of an object.
    """

    is_local = False

    def __init__(
        self,
        url: str,
        endpoint_url: str | None = None,
        timeout: float = 10.0,
        max_attempts: int = 4,
        headers: Mapping[str, str] | None = None,
    ) -> None:
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
        if headers:
            extra = dict(headers)

            def add_headers(request: Any, **_: Any) -> None:
                request.headers.update(extra)

            self.client.meta.events.register("before-sign.s3", add_headers)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts) if base else posixpath.join(*parts)

    def resolve(self, path: str) -> str | None:
        normal = posixpath.normpath(path).lstrip("/")
        if normal == self.root or not self.root or normal.startswith(self.root + "/"):
            return normal
        return None

    def root_of(self, path: str) -> str:
        return self.root

    def locate(self, location: str) -> str | None:
        bucket, _, key = location.removeprefix("s3://").partition("/")
        return key if location.startswith("s3://") and bucket == self.bucket else None

    def _check_inside(self, path: str) -> None:
        """Keys are names, not links: a key is inside the root exactly when it is below the prefix."""
        if self.resolve(path) != path:
            raise OutsideRootError(f"{path} lies outside the data root (s3://{self.bucket}/{self.root})")

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
        return int(getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))

    def identity(self, path: str) -> FileIdentity | None:
        from botocore.exceptions import ClientError

        self._check_inside(path)
        try:
            head = self._call("head_object", Key=path)
        except ClientError as exc:
            if self._status(exc) == 404:
                return None
            raise
        return FileIdentity(head["ContentLength"], head["ETag"], head["LastModified"].timestamp())

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        """A ranged GET with If-Match: an object is replaced whole, so every version is settled."""
        from botocore.exceptions import ClientError

        self._check_inside(path)
        if size == 0:
            return b""
        try:
            answer = self._call(
                "get_object", Key=path, Range=f"bytes={offset}-{offset + size - 1}", IfMatch=expected.version
            )
            data: bytes = answer["Body"].read()
        except ClientError as exc:
            raise FileChangedError(f"s3://{self.bucket}/{path} changed or vanished while it was being read") from exc
        except OSError as exc:
            raise StoreUnavailableError(f"s3://{self.bucket}/{path}: read failed: {exc}") from exc
        if len(data) != size:
            raise TruncatedFileError(f"s3://{self.bucket}/{path}: wanted {size} bytes at {offset}, got {len(data)}")
        return data

    def _read_whole(self, path: str, limit: int) -> tuple[bytes, FileIdentity] | None:
        from botocore.exceptions import ClientError

        self._check_inside(path)
        try:
            answer = self._call("get_object", Key=path)
            if answer["ContentLength"] > limit:
                answer["Body"].close()
                refuse_oversized(f"s3://{self.bucket}/{path}", answer["ContentLength"], limit)
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
                    if is_listed(name):
                        names.append(name)
        except Exception as exc:
            raise StoreUnavailableError(f"s3://{self.bucket}/{prefix}: listing failed: {exc}") from exc
        return sorted(names)

    def is_directory(self, path: str) -> bool:
        answer = self._call("list_objects_v2", Prefix=path.rstrip("/") + "/", MaxKeys=1)
        return int(answer.get("KeyCount", 0)) > 0
