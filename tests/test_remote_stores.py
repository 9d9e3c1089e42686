"""Google Cloud Storage, Azure Blob Storage and HTTPS as stores: the store contract on emulators run here.

fake-gcs-server and Azurite (tests/support/emulators.py) and a static HTTPS server with a certificate made
here (tests/support/https.py) are started by these tests. Each store passes the shared contract of
``test_store_contract``; the faults a network store meets (an outage, an object replaced between the
lookup and the read, refused credentials) are checked at the store here and through a gateway in
``test_remote_roots``.
"""

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.emulators import Azurite, FakeGcs, environment, start_azurite, start_fake_gcs
from support.https import Certificate, FileServer, make_certificate
from support.store_contract import DATA, LocalStoreContract, UnreachableStoreContract

from gateway_storage import (
    FileChangedError,
    OutsideRootError,
    RoutedStore,
    Store,
    StoreUnavailableError,
    TruncatedFileError,
    headers_for,
    open_store,
    read_headers_file,
)
from gateway_storage.remote import AzureStore, GCSStore, HTTPSStore
from gateway_storage.store import is_absolute_location

BUCKET = "store-contract"
_GOOGLE = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_BASE_URL")
_AZURE = (
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_ENDPOINT",
)


def nobody() -> str:
    """``host:port`` of a loopback port nothing listens on: connection refused."""
    from support.processes import free_port

    return f"127.0.0.1:{free_port()}"


# --- Google Cloud Storage, on fake-gcs-server ---------------------------------------------------------


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    server = start_fake_gcs(tmp_path_factory.mktemp("gcs") / "gcs.log")
    server.create_bucket(BUCKET)
    with environment(server.env, cleared=_GOOGLE):
        yield server
    server.stop()


class TestGCSStore(UnreachableStoreContract):
    writable = False  # fake-gcs-server has no XML API, whose PUT obstore writes with ("invalid uploadType")
    """A bucket prefix: one fresh prefix per test."""

    @pytest.fixture
    def store(self, gcs: FakeGcs) -> Store:
        self.gcs = gcs
        return GCSStore(f"gs://{BUCKET}/{uuid.uuid4().hex}/root")

    def key(self, path: str) -> str:
        return path.removeprefix(f"gs://{BUCKET}/")

    def write(self, store: Store, name: str, data: bytes) -> str:
        path = self.path(store, *name.split("/"))
        self.gcs.put(BUCKET, self.key(path), data)
        return path

    def outside(self, store: Store, name: str, data: bytes) -> str:
        self.gcs.put(BUCKET, self.key(store.root).rpartition("/")[0] + "/outside/" + name, data)
        return store.join(store.root, "..", "outside", *name.split("/"))

    def replica(self, store: Store) -> Store:
        other = GCSStore(f"gs://{BUCKET}/{uuid.uuid4().hex}/root")
        for key in self.gcs.keys(BUCKET, self.key(store.root) + "/"):
            self.gcs.copy(BUCKET, key, self.key(other.root) + key.removeprefix(self.key(store.root)))
        return other

    @pytest.fixture
    def unreachable(self, gcs: FakeGcs) -> Iterator[Store]:
        with environment({"STORAGE_EMULATOR_HOST": f"http://{nobody()}"}):
            yield GCSStore(f"gs://{BUCKET}/root", timeout=1.0, max_attempts=1)

    def test_a_version_is_the_generation_and_a_read_asks_for_it(self, store: Store) -> None:
        path = self.write(store, "org/ds/data.bin", DATA)
        identity = store.identity(path)
        assert identity is not None
        generation = self.gcs.put(BUCKET, self.key(path), DATA)["generation"]  # the same bytes, a new generation
        assert store.identity(path) == identity._replace(version=generation, mtime=store.identity(path).mtime)  # type: ignore[union-attr]
        with pytest.raises(FileChangedError):
            store.read(path, 0, 8, identity, limit=8)


# --- Azure Blob Storage, on Azurite ------------------------------------------------------------------

CONTAINER = "store-contract"


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = start_azurite(tmp_path_factory.mktemp("azurite"))
    server.create_container(CONTAINER)
    with environment(server.env, cleared=_AZURE):
        yield server
    server.stop()


class TestAzureStore(UnreachableStoreContract):
    @pytest.fixture
    def store(self, azurite: Azurite) -> Store:
        self.azurite = azurite
        return AzureStore(f"az://{CONTAINER}/{uuid.uuid4().hex}/root")

    def key(self, path: str) -> str:
        return path.removeprefix(f"az://{CONTAINER}/")

    def write(self, store: Store, name: str, data: bytes) -> str:
        path = self.path(store, *name.split("/"))
        self.azurite.put(CONTAINER, self.key(path), data)
        return path

    def outside(self, store: Store, name: str, data: bytes) -> str:
        self.azurite.put(CONTAINER, self.key(store.root).rpartition("/")[0] + "/outside/" + name, data)
        return store.join(store.root, "..", "outside", *name.split("/"))

    def replica(self, store: Store) -> Store:
        other = AzureStore(f"az://{CONTAINER}/{uuid.uuid4().hex}/root")
        container: Any = self.azurite.service().get_container_client(CONTAINER)
        for blob in container.list_blobs(name_starts_with=self.key(store.root) + "/"):
            data = container.download_blob(blob.name).readall()
            self.azurite.put(CONTAINER, self.key(other.root) + blob.name.removeprefix(self.key(store.root)), data)
        return other

    @pytest.fixture
    def unreachable(self, azurite: Azurite) -> Iterator[Store]:
        moved = azurite.connection_string.replace(azurite.endpoint, f"http://{nobody()}/devstoreaccount1")
        with environment({"AZURE_STORAGE_CONNECTION_STRING": moved}):
            yield AzureStore(f"az://{CONTAINER}/root", timeout=1.0, max_attempts=1)

    def test_a_wrong_account_key_is_unavailable_and_says_so(self, azurite: Azurite) -> None:
        """Refused credentials are a store fault (503 at the gateway), never "absent"."""
        wrong = azurite.connection_string.replace("AccountKey=", "AccountKey=AAAA")
        with environment({"AZURE_STORAGE_CONNECTION_STRING": wrong}):
            store = AzureStore(f"az://{CONTAINER}/root", timeout=2.0, max_attempts=1)
        with pytest.raises(StoreUnavailableError, match="az://store-contract"):
            store.identity(store.join(store.root, "org", "ds", "datasource-properties.json"))


# --- HTTPS, on a local server with a certificate made here ---------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificate]:
    made = make_certificate(tmp_path_factory.mktemp("certificate"))
    with environment({"SSL_CERT_FILE": str(made.authority)}):
        yield made


@pytest.fixture(scope="module")
def https(certificate: Certificate, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    server = FileServer(tmp_path_factory.mktemp("www"), certificate)
    server.start()
    yield server
    server.stop()


class TestHTTPSStore(UnreachableStoreContract):
    writable = False  # a web server is read, never written

    @pytest.fixture
    def store(self, https: FileServer) -> Store:
        self.https = https
        return HTTPSStore(f"{https.url}/{uuid.uuid4().hex}/root")

    def local(self, path: str) -> Path:
        return Path(self.https.root, path.removeprefix(self.https.url + "/"))

    def write(self, store: Store, name: str, data: bytes) -> str:
        path = self.path(store, *name.split("/"))
        target = self.local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, target)  # a new inode: a new ETag
        return path

    def outside(self, store: Store, name: str, data: bytes) -> str:
        target = self.local(store.root).parent / "outside" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return store.join(store.root, "..", "outside", *name.split("/"))

    def replica(self, store: Store) -> Store:
        other = HTTPSStore(f"{self.https.url}/{uuid.uuid4().hex}/root")
        shutil.copytree(self.local(store.root), self.local(other.root))
        return other

    @pytest.fixture
    def unreachable(self, https: FileServer) -> Store:
        return HTTPSStore(f"https://{nobody()}/root", timeout=1.0, max_attempts=1)

    def test_a_server_that_cannot_list_still_serves_files_by_name(
        self, certificate: Certificate, tmp_path: Path
    ) -> None:
        (tmp_path / "org" / "ds").mkdir(parents=True)
        (tmp_path / "org" / "ds" / "data.bin").write_bytes(DATA)
        server = FileServer(tmp_path, certificate, listing=False)
        server.start()
        try:
            store = HTTPSStore(server.url)
            path = store.join(store.root, "org", "ds", "data.bin")
            assert store.list_directories(store.root) == []  # PROPFIND answered 405: nothing can be listed
            assert store.list_files(store.root, limit=10) is None  # and no data stamp can be taken there
            assert store.is_directory(store.join(store.root, "org"))
            identity = store.identity(path)
            assert identity is not None and store.read(path, 3, 5, identity, limit=5) == DATA[3:8]
        finally:
            server.stop()

    def test_an_untrusted_certificate_is_unavailable(self, https: FileServer) -> None:
        with environment({}, cleared=("SSL_CERT_FILE",)):
            store = HTTPSStore(https.url, timeout=2.0, max_attempts=1)
        with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1"):
            store.identity(store.join(store.root, "x.bin"))


def test_headers_reach_only_the_stores_below_their_prefix(certificate: Certificate, tmp_path: Path) -> None:
    """An HTTPS server that wants a token: sent by the store whose root lies below the headers' prefix."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "file.bin").write_bytes(DATA)
    token = {"Authorization": "Bearer lab-token"}
    server = FileServer(tmp_path, certificate, required=token)
    server.start()
    try:
        headers = {server.url + "/data": token, "https://127.0.0.1": {"X-Wrong": "no"}}
        assert headers_for(server.url + "/data/x", headers) == token
        assert headers_for(server.url + "/database", headers) == {}  # a prefix ends at a path boundary
        assert headers_for(server.url, {server.url + "/": token}) == token
        store = open_store(server.url + "/data", headers=headers)
        path = store.join(store.root, "file.bin")
        identity = store.identity(path)
        assert identity is not None and store.read(path, 7, 9, identity, limit=9) == DATA[7:16]
        without = open_store(server.url + "/data", max_attempts=1)
        with pytest.raises(StoreUnavailableError, match="credentials") as refused:
            without.identity(path)
        assert server.url in str(refused.value)
    finally:
        server.stop()


def test_a_headers_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "headers.json"
    good.write_text(json.dumps({"https://host/x": {"Authorization": "Bearer t"}}))
    assert read_headers_file(str(good)) == {"https://host/x": {"Authorization": "Bearer t"}}
    for text in ("[]", '{"https://host": "Bearer t"}', '{"ftp://host": {"a": "b"}}', '{"https://h": {"a": 1}}', "{"):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match="headers file"):
            read_headers_file(str(bad))
    with pytest.raises(ValueError, match="cannot be read"):
        read_headers_file(str(tmp_path / "absent.json"))


class TestRoutedLocalStore(LocalStoreContract):
    """A local root with a remote root beside it is still a local store, for every local path."""

    @pytest.fixture
    def store(self, tmp_path: Path, https: FileServer) -> Store:
        (tmp_path / "root").mkdir()
        return open_store(str(tmp_path / "root"), remote_roots=[f"{https.url}/remote"])

    def replica(self, store: Store) -> Store:
        copy = Path(store.root).parent / f"replica-{uuid.uuid4().hex}"
        shutil.copytree(store.root, copy, symlinks=True)
        return open_store(str(copy), remote_roots=[f"{self_url(store)}/remote"])


def self_url(store: Store) -> str:
    assert isinstance(store, RoutedStore)
    return store.remotes[0].root.removesuffix("/remote")


def test_a_mag_url_in_the_data_roots_own_bucket_is_the_data_roots(gcs: FakeGcs) -> None:
    store = GCSStore(f"gs://{BUCKET}/shared/root")
    inside, other_prefix = f"gs://{BUCKET}/shared/root/org/ds/color/1", f"gs://{BUCKET}/shared/other/x"
    assert store.locate(inside) == inside and store.resolve(inside) == inside
    assert store.locate(other_prefix) == other_prefix and store.resolve(other_prefix) is None  # located, refused
    assert store.locate("gs://another-bucket/x") is None and store.locate("/local/path") is None


# --- faults at the store -------------------------------------------------------------------------------


def test_an_https_outage_is_unavailable_then_heals(https: FileServer) -> None:
    name = uuid.uuid4().hex
    (https.root / name).mkdir()
    (https.root / name / "data.bin").write_bytes(DATA)
    store = HTTPSStore(f"{https.url}/{name}", timeout=2.0, max_attempts=2)
    path = store.join(store.root, "data.bin")
    identity = store.identity(path)
    assert identity is not None
    for mode in ("error", "close"):
        https.mode = mode
        try:
            with pytest.raises(StoreUnavailableError):
                store.read(path, 0, 16, identity, limit=16)
            with pytest.raises(StoreUnavailableError):
                store.identity(path)
            assert len(https.take()) >= 2  # retried before giving up
        finally:
            https.mode = "forward"
        assert store.read(path, 0, 16, identity, limit=16) == DATA[:16]


def test_ranged_reads_fetch_only_the_bytes_asked_for(https: FileServer) -> None:
    name = uuid.uuid4().hex
    (https.root / name).mkdir()
    (https.root / name / "data.bin").write_bytes(DATA)
    store = HTTPSStore(f"{https.url}/{name}")
    path = store.join(store.root, "data.bin")
    identity = store.identity(path)
    assert identity is not None
    https.take()
    assert store.read(path, 1000, 32, identity, limit=32) == DATA[1000:1032]
    assert https.take() == [("GET", f"/{name}/data.bin", "bytes=1000-1031")]
    with pytest.raises(TruncatedFileError):
        store.read(path, len(DATA) - 4, 8, identity, limit=8)


# --- remote roots: mag paths that are URLs --------------------------------------------------------------


def test_urls_are_read_only_below_an_allowed_remote_root(https: FileServer, tmp_path: Path) -> None:
    name = uuid.uuid4().hex
    for directory in ("allowed", "secret"):
        (https.root / name / directory).mkdir(parents=True)
        (https.root / name / directory / "data.bin").write_bytes(DATA)
    store = open_store(str(tmp_path), remote_roots=[f"{https.url}/{name}/allowed"])
    assert isinstance(store, RoutedStore) and not store.is_local
    allowed = f"{https.url}/{name}/allowed/data.bin"
    assert store.locate(allowed) == allowed and store.resolve(allowed) == allowed
    assert store.relative(allowed) == allowed  # a remote path is named in full: the same on every replica
    found = store.read_whole(allowed, limit=1 << 20)
    assert found is not None and found[0] == DATA
    for refused in (
        f"{https.url}/{name}/secret/data.bin",
        f"{https.url}/{name}/allowed/../secret/data.bin",
        f"{https.url}@127.0.0.2/{name}/allowed/data.bin",
    ):
        assert store.resolve(refused) is None
    with pytest.raises(OutsideRootError):
        store.read_whole(f"{https.url}/{name}/secret/data.bin", limit=1 << 20)
    assert store.locate("https://elsewhere.example/x") is None  # no store holds it: nothing would read it
    assert store.locate(str(tmp_path / "x")) == str(tmp_path / "x")  # local paths stay the local store's
    assert is_absolute_location("https://elsewhere.example/x") and not is_absolute_location("color/1")


def test_a_store_read_of_32_kib_costs(https: FileServer, gcs: FakeGcs, azurite: Azurite) -> None:
    """Measured, not asserted on speed: what one ranged 32 KiB read costs through each store (printed with -s)."""
    data = os.urandom(1 << 20)
    name = uuid.uuid4().hex
    (https.root / name).mkdir()
    (https.root / name / "big.bin").write_bytes(data)
    gcs.put(BUCKET, f"{name}/big.bin", data)
    azurite.put(CONTAINER, f"{name}/big.bin", data)
    stores = {
        "gcs (fake-gcs-server)": GCSStore(f"gs://{BUCKET}/{name}"),
        "azure (azurite)": AzureStore(f"az://{CONTAINER}/{name}"),
        "https (python http.server)": HTTPSStore(f"{https.url}/{name}"),
    }
    for label, store in stores.items():
        path = store.join(store.root, "big.bin")
        identity = store.identity(path)
        assert identity is not None
        assert store.read(path, 4096, 32768, identity, limit=32768) == data[4096 : 4096 + 32768]
        started = time.perf_counter()
        for i in range(50):
            store.read(path, 4096 * i, 32768, identity, limit=32768)
        print(f"{label}: {(time.perf_counter() - started) / 50 * 1000:.2f} ms per ranged 32 KiB read")
