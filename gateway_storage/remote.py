"""S3, Google Cloud Storage, Azure Blob Storage and HTTPS servers as stores, all read through obstore.

obstore (a Rust client for every object store) is imported here only, when such a store is opened.
One base class, :class:`ObjectStore`, does what they share: paths are URLs (``s3://bucket/key``,
``gs://bucket/key``, ``az://container/key``, ``https://host/path``), every read is one ranged GET that
names the version it expects, transient faults are retried by the client and what still fails is
StoreUnavailableError. Each provider says only how it is reached and how a version is named. One class
per provider serves both a data root and a remote root.
"""

import os
import posixpath
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from .errors import FileChangedError, OutsideRootError, StorageError, StoreUnavailableError, TruncatedFileError
from .identity import FileIdentity, ListedFile
from .store import Store, is_listed, refuse_overlong, refuse_oversized

# A private certificate authority to trust besides the system's (a self-hosted server, a test): the
# variable OpenSSL, requests and curl read too.
CA_BUNDLE_ENV = "SSL_CERT_FILE"


class ObjectStore(Store):
    """A prefix of a bucket, container or web server, read with ranged GETs through obstore.

    Paths are full URLs below :attr:`origin` (``scheme://bucket``), so a store names every object the
    same way a ``datasource-properties.json`` does. Keys are names, not links: a path is inside the
    root exactly when its normalized key lies below the prefix.
    """

    is_local = False
    scheme: str  # the URL scheme this kind of store is opened for
    netloc_name = "bucket"  # what the URL's netloc names, for the message that refuses a URL

    def __init__(
        self, url: str, timeout: float = 10.0, max_attempts: int = 4, headers: Mapping[str, str] | None = None
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != self.scheme or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"{url!r} is not a {self.scheme}://{self.netloc_name}/prefix URL")
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.prefix = posixpath.normpath("/" + parts.path).strip("/")
        self.root = self._url(self.prefix)
        self.timeout = timeout
        self.client: Any = self._client(
            parts.netloc,
            client_options=self._client_options(timeout, headers or {}),
            retry_config={
                "max_retries": max(max_attempts - 1, 0),
                "retry_timeout": timedelta(seconds=timeout * max_attempts),
                "backoff": {
                    "init_backoff": timedelta(milliseconds=100),
                    "max_backoff": timedelta(seconds=2),
                    "base": 2,
                },
            },
        )

    # --- what a provider says ------------------------------------------------------------------

    def _client(self, netloc: str, client_options: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        """The obstore client over the whole bucket (container, server): keys are given in full."""
        raise NotImplementedError

    def _client_options(self, timeout: float, headers: Mapping[str, str]) -> dict[str, Any]:
        options: dict[str, Any] = {"connect_timeout": timedelta(seconds=timeout), "timeout": timedelta(seconds=timeout)}
        if headers:
            options["default_headers"] = dict(headers)  # an HTTPS server's token, a proxy's header
        bundle = os.environ.get(CA_BUNDLE_ENV)
        if bundle:
            with open(bundle) as handle:
                options["root_certificate"] = handle.read()
        return options

    def _version(self, meta: Mapping[str, Any]) -> str | None:
        """What names one version of an object in the provider's answers: its ETag unless said otherwise."""
        return meta.get("e_tag")

    def _listed_version(self, meta: Mapping[str, Any]) -> str | None:
        """What names one version of an object in a listing (some providers list no generation)."""
        return self._version(meta)

    def _get_options(self, expected: FileIdentity) -> dict[str, Any]:
        """How a GET asks for exactly the version ``expected`` (the provider refuses any other)."""
        return {"if_match": expected.version}

    # --- names ---------------------------------------------------------------------------------

    def _url(self, key: str) -> str:
        return f"{self.origin}/{key}" if key else self.origin

    def _key(self, path: str) -> str | None:
        """The normalized key of a URL of this origin, or None for another origin or a key that climbs out."""
        if path != self.origin and not path.startswith(self.origin + "/"):
            return None
        rest = path[len(self.origin) :]
        normal = posixpath.normpath("/" + rest).strip("/") if rest.strip("/") else ""
        return normal

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts if part.strip("/"))])

    def resolve(self, path: str) -> str | None:
        key = self._key(path)
        if key is None or not (not self.prefix or key == self.prefix or key.startswith(self.prefix + "/")):
            return None
        return self._url(key)

    def root_of(self, path: str) -> str:
        return self.root

    def locate(self, location: str) -> str | None:
        return location if self._key(location) is not None else None

    def _inside(self, path: str) -> str:
        """The key of ``path``, which must lie inside the root."""
        resolved = self.resolve(path)
        key = None if resolved is None or resolved != path.rstrip("/") else self._key(resolved)
        if key is None:
            raise OutsideRootError(f"{path} lies outside the data root ({self.root})")
        return key

    # --- faults --------------------------------------------------------------------------------

    def _unavailable(self, what: str, exc: Exception) -> StoreUnavailableError:
        from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
            return StoreUnavailableError(f"{self.origin}: {what} refused, check the credentials: {first_line}")
        return StoreUnavailableError(f"{self.origin}: {what} failed: {first_line}")

    # --- reads ---------------------------------------------------------------------------------

    def _identity(self, meta: Mapping[str, Any], path: str, listed: bool = False) -> FileIdentity:
        version = self._listed_version(meta) if listed else self._version(meta)
        if not version:
            raise StoreUnavailableError(f"{path}: the store names no version of it (no ETag), so it cannot be read")
        modified = meta["last_modified"].timestamp()
        return FileIdentity(int(meta["size"]), version, modified, modified)

    def identity(self, path: str) -> FileIdentity | None:
        import obstore

        key = self._inside(path)
        try:
            meta = obstore.head(self.client, key)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._unavailable(f"HEAD {key}", exc) from exc
        return self._identity(meta, path)

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        """One ranged GET that names ``expected``: an object is replaced whole, so every version is settled."""
        import obstore
        from obstore.exceptions import PreconditionError

        key = self._inside(path)
        if size == 0:
            return b""
        if offset + size > expected.size:
            raise TruncatedFileError(f"{path}: wanted {size} bytes at {offset}, the object has {expected.size}")
        options = {**self._get_options(expected), "range": (offset, offset + size)}
        try:
            answer = obstore.get(self.client, key, options=options)  # type: ignore[arg-type]
            data = bytes(answer.bytes())
        except (FileNotFoundError, PreconditionError) as exc:
            raise FileChangedError(f"{path} changed or vanished while it was being read") from exc
        except Exception as exc:
            raise self._unavailable(f"GET {key}", exc) from exc
        if self._version(answer.meta) not in (None, expected.version):
            raise FileChangedError(f"{path} changed while it was being read")  # a server that ignores If-Match
        if len(data) != size:
            raise TruncatedFileError(f"{path}: wanted {size} bytes at {offset}, got {len(data)}")
        return data

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        """One GET: an object is replaced whole, so every version is settled."""
        import obstore

        key = self._inside(path)
        try:
            answer = obstore.get(self.client, key)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._unavailable(f"GET {key}", exc) from exc
        refuse_oversized(path, int(answer.meta["size"]), limit)  # the body is streamed: none of it read yet
        try:
            data = bytes(answer.bytes())
        except Exception as exc:
            raise self._unavailable(f"GET {key}", exc) from exc
        identity = self._identity(answer.meta, path)
        if len(data) != identity.size:
            raise FileChangedError(f"{path} changed while it was being read")
        return data, identity

    # --- directories ---------------------------------------------------------------------------

    def _listing(self, path: str) -> tuple[list[str], int]:
        """The names of the prefixes right below ``path``, and how many objects lie there."""
        key = self._inside(path)
        try:
            found = self.client.list_with_delimiter(key + "/" if key else None)
        except FileNotFoundError:
            return [], 0
        except Exception as exc:
            raise self._unavailable(f"listing {key or '/'}", exc) from exc
        names = [posixpath.basename(prefix.rstrip("/")) for prefix in found["common_prefixes"]]
        return names, len(found["objects"])

    def list_directories(self, path: str) -> list[str]:
        return sorted(name for name in self._listing(path)[0] if is_listed(name))

    def is_directory(self, path: str) -> bool:
        names, objects = self._listing(path)
        return bool(names or objects)

    def write(self, path: str, data: bytes) -> None:
        """See :meth:`Store.write`: one PUT, which the store makes visible whole or not at all."""
        import obstore

        key = self._inside(path)
        try:
            obstore.put(self.client, key, data)
        except Exception as exc:
            raise self._unavailable(f"PUT {key}", exc) from exc

    def delete(self, path: str) -> None:
        import obstore

        key = self._inside(path)
        try:
            obstore.delete(self.client, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._unavailable(f"DELETE {key}", exc) from exc

    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        """See :meth:`Store.list_files`: the objects below the prefix, a page of a thousand at a time, each
        with its version (ETag or generation) and size."""
        import obstore

        key = self._inside(path)
        prefix = key + "/" if key else ""
        found: list[ListedFile] = []
        try:
            for page in obstore.list(self.client, prefix or None, chunk_size=1000):
                for meta in page:
                    refuse_overlong(path, len(found) + 1, limit)
                    found.append(ListedFile(str(meta["path"]).removeprefix(prefix), self._identity(meta, path, True)))
        except FileNotFoundError:
            return []
        except StorageError:
            raise
        except Exception as exc:
            raise self._unavailable(f"listing {key or '/'}", exc) from exc
        found.sort()
        return found


class GCSStore(ObjectStore):
    """A bucket prefix in Google Cloud Storage, ``gs://bucket/prefix``.

    Credentials as Google's own clients find them: ``GOOGLE_APPLICATION_CREDENTIALS`` (a service
    account file), ``GOOGLE_SERVICE_ACCOUNT_KEY``, or the metadata server of the machine (GKE workload
    identity). ``GOOGLE_SKIP_SIGNATURE=true`` reads a public bucket anonymously; ``STORAGE_EMULATOR_HOST``
    (as google-cloud-storage reads it) points at an emulator, anonymously. A version is the object's
    generation, and each read asks for that generation: a replaced object is another generation.
    """

    scheme = "gs"

    def _client(self, netloc: str, client_options: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        client = _obstore_class("GCSStore")

        config: dict[str, Any] = {}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            base_url = emulator if "://" in emulator else f"http://{emulator}"
            config.update(base_url=base_url.rstrip("/"), skip_signature=True)
            client_options = {**client_options, "allow_http": base_url.startswith("http://")}
        return client(netloc, config=config, client_options=client_options, retry_config=retry_config)

    def _version(self, meta: Mapping[str, Any]) -> str | None:
        return meta.get("version")

    def _listed_version(self, meta: Mapping[str, Any]) -> str | None:
        return meta.get("version") or meta.get("e_tag")  # a listing names the ETag, which a new generation changes

    def _get_options(self, expected: FileIdentity) -> dict[str, Any]:
        return {"version": expected.version}


class AzureStore(ObjectStore):
    """A container prefix in Azure Blob Storage, ``az://container/prefix``.

    Credentials from the environment Azure's tools use: ``AZURE_STORAGE_CONNECTION_STRING``, or
    ``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``
    (or a managed identity, or ``AZURE_STORAGE_USE_EMULATOR=true`` for Azurite). ``AZURE_STORAGE_ENDPOINT``
    names another endpoint. A version is the blob's ETag, and each read carries ``If-Match``.
    """

    scheme = "az"

    netloc_name = "container"

    def _client(self, netloc: str, client_options: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        client = _obstore_class("AzureStore")

        config = connection_string_config(os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
        endpoint = config.get("endpoint") or os.environ.get("AZURE_STORAGE_ENDPOINT") or ""
        if endpoint.startswith("http://") or os.environ.get("AZURE_STORAGE_USE_EMULATOR", "").lower() == "true":
            client_options = {**client_options, "allow_http": True}
        return client(netloc, config=config, client_options=client_options, retry_config=retry_config)


class S3Store(ObjectStore):
    """A bucket prefix in S3 or an S3-compatible server, ``s3://bucket/prefix``, as a data root or a remote root.

    Credentials, region and endpoint from the AWS environment: ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``) and
    ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (an S3-compatible server such as MinIO or Ceph, plain
    HTTP allowed there). A version is the object's ETag, and each read carries ``If-Match``.
    """

    scheme = "s3"

    def __init__(
        self, url: str, timeout: float = 10.0, max_attempts: int = 4, headers: Mapping[str, str] | None = None
    ) -> None:
        # Read once, as the client is configured once: messages name the server the client talks to.
        self._endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        super().__init__(url, timeout, max_attempts, headers)

    def _client(self, netloc: str, client_options: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        client = _obstore_class("S3Store")

        config: dict[str, Any] = {}
        endpoint = self.endpoint()
        if endpoint:
            config["endpoint"] = endpoint.rstrip("/")
            client_options = {**client_options, "allow_http": endpoint.startswith("http://")}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            config["region"] = region
        return client(netloc, config=config, client_options=client_options, retry_config=retry_config)

    def endpoint(self) -> str | None:
        """The S3-compatible server the environment named instead of AWS's, if any."""
        return self._endpoint


def _obstore_class(name: str) -> Any:
    """An ``obstore.store`` class, typed loosely: its option types are TypedDicts; ours are built as plain dicts."""
    import obstore.store

    return getattr(obstore.store, name)


def connection_string_config(text: str) -> dict[str, str]:
    """obstore's Azure settings from a connection string (``AccountName=...;AccountKey=...;BlobEndpoint=...``)."""
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    names = {"AccountName": "account_name", "AccountKey": "account_key", "SharedAccessSignature": "sas_key"}
    config = {ours: fields[theirs] for theirs, ours in names.items() if fields.get(theirs)}
    if fields.get("BlobEndpoint"):
        config["endpoint"] = fields["BlobEndpoint"].rstrip("/")
    return config


class HTTPSStore(ObjectStore):
    """A web server's directory, ``https://host/prefix``: plain GETs with ``Range`` and ``If-Match``.

    A version is the file's ETag; a server that ignores ``If-Match`` is still caught, by the ETag of
    the answer. Listing uses WebDAV ``PROPFIND``; a server without it cannot be listed (its datasets
    are found by name), and every path of it counts as a directory. ``SSL_CERT_FILE`` adds a private
    certificate authority.
    """

    scheme = "https"

    netloc_name = "host"

    def _client(self, netloc: str, client_options: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        client = _obstore_class("HTTPStore")

        return client(self.origin, client_options=client_options, retry_config=retry_config)

    def _listing(self, path: str) -> tuple[list[str], int]:
        try:
            return super()._listing(path)
        except StoreUnavailableError as exc:
            if _refused_listing(exc):
                return [], 1  # the server answered, but does not list: what lies there is found by name
            raise

    def write(self, path: str, data: bytes) -> None:
        raise StorageError(f"{path}: a web server is read here, never written")

    def delete(self, path: str) -> None:
        raise StorageError(f"{path}: a web server is read here, never written")

    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        """One ``PROPFIND`` (depth 1) per directory, as a WebDAV server lists; None from a server that does not."""
        key = self._inside(path)
        found: list[ListedFile] = []
        pending, entries = [key], 0
        while pending:
            below = pending.pop()
            try:
                listing = self.client.list_with_delimiter(below + "/" if below else None)
            except FileNotFoundError:
                continue
            except Exception as exc:
                failed = self._unavailable(f"listing {below or '/'}", exc)
                failed.__cause__ = exc
                if _refused_listing(failed):
                    return None
                raise failed from exc
            entries += len(listing["objects"]) + len(listing["common_prefixes"])
            refuse_overlong(path, entries, limit)
            pending += [prefix.rstrip("/") for prefix in listing["common_prefixes"]]
            for meta in listing["objects"]:
                relative = str(meta["path"]).removeprefix(key + "/" if key else "")
                found.append(ListedFile(relative, self._identity(meta, path, True)))
        found.sort()
        return found


def _refused_listing(exc: StoreUnavailableError) -> bool:
    """Whether a failed PROPFIND was answered "not allowed / not implemented": the server is there."""
    cause = str(exc.__cause__ or "")
    return any(f"{status}" in cause for status in ("405 Method Not Allowed", "501 Not Implemented"))
