"""The store contract: what every store of the storage kernel must do, whatever holds the bytes.

In the manner of zarr-python's ``StoreTests``: :class:`StoreContract` states the contract as tests,
and each store subclasses it with fixtures that make a store over a fresh root and write files into
it the store's own way (a local directory; a bucket prefix on moto's real S3 server). A store that
can be unreachable (a network service) also subclasses :class:`UnreachableStoreContract`. New stores
(GCS, Azure, HTTPS) are new subclasses here. Every view of a store (a :class:`WrapperStore`) runs the
contract over a local directory and over S3 too.
"""

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.emulators import environment
from support.processes import free_port
from support.s3 import Moto, aws_environment, start_moto
from support.store_contract import LocalStoreContract, UnreachableStoreContract

from gateway.sources.watched import Observed, WatchedStore
from gateway_storage import AnchoredStore, LocalStore, Store, WrapperStore
from gateway_storage.remote import S3Store


class TestLocalStore(LocalStoreContract):
    """A local directory."""


# --- the views of a store: each a WrapperStore that must still be the store it wraps ----------------------

VIEWS: dict[str, Callable[[Store], Store]] = {
    "wrapper": WrapperStore,  # the generic wrapper itself, changing nothing
    "anchored": lambda inner: AnchoredStore(inner, inner.root),  # a mag's view: here the root, below which all lies
    "watched": lambda inner: WatchedStore(inner, Observed()),  # the catalog's recorder of what a load looks at
}


@pytest.fixture(params=sorted(VIEWS))
def view(request: pytest.FixtureRequest) -> Callable[[Store], Store]:
    return VIEWS[request.param]


class TestViewsOfLocalStore(LocalStoreContract):
    """A local directory seen through each view: the whole contract holds through it."""

    @pytest.fixture
    def store(self, tmp_path: Path, view: Callable[[Store], Store]) -> Store:
        self.view = view
        (tmp_path / "root").mkdir()
        return view(LocalStore(str(tmp_path / "root")))

    def replica(self, store: Store) -> Store:
        copy = Path(store.root).parent / f"replica-{uuid.uuid4().hex}"
        shutil.copytree(store.root, copy, symlinks=True)
        return self.view(LocalStore(str(copy)))


# --- S3, on moto's real server -----------------------------------------------------------------------

BUCKET = "store-contract"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    with aws_environment(server.endpoint):
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    server.stop()


class TestS3Store(UnreachableStoreContract):
    """A bucket prefix, whose paths are ``s3://`` URLs (a data root and a remote root alike): one fresh prefix
    per test."""

    @pytest.fixture
    def store(self, moto: Moto) -> Store:
        self.client: Any = moto.client()
        return S3Store(f"s3://{BUCKET}/{uuid.uuid4().hex}/root")

    def key(self, path: str) -> str:
        return path.removeprefix(f"s3://{BUCKET}/")

    def write(self, store: Store, name: str, data: bytes) -> str:
        path = self.path(store, *name.split("/"))
        self.client.put_object(Bucket=BUCKET, Key=self.key(path), Body=data)
        return path

    def outside(self, store: Store, name: str, data: bytes) -> str:
        # Keys are names, not links: what lies outside is a key past the prefix, reached by a path with "..".
        self.client.put_object(
            Bucket=BUCKET, Key=self.key(store.root).rpartition("/")[0] + "/outside/" + name, Body=data
        )
        return store.join(store.root, "..", "outside", *name.split("/"))

    def replica(self, store: Store) -> Store:
        other = S3Store(f"s3://{BUCKET}/{uuid.uuid4().hex}/root")
        listed = self.client.list_objects_v2(Bucket=BUCKET, Prefix=self.key(store.root) + "/")
        for item in listed.get("Contents", []):
            target = self.key(other.root) + item["Key"].removeprefix(self.key(store.root))
            self.client.copy_object(Bucket=BUCKET, Key=target, CopySource={"Bucket": BUCKET, "Key": item["Key"]})
        return other

    @pytest.fixture
    def unreachable(self, moto: Moto) -> Iterator[Store]:
        with environment({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}):  # nothing listens there
            yield S3Store(f"s3://{BUCKET}/root", timeout=1.0, max_attempts=1)

    def test_the_endpoint_is_the_one_the_environment_names(self, store: Store, unreachable: Store) -> None:
        """What start-up messages name: moto for one store, the closed port for the other (read at opening)."""
        assert store.endpoint() == self.client.meta.endpoint_url
        assert unreachable.endpoint() != store.endpoint() and unreachable.endpoint() is not None


class TestViewsOfS3Store(TestS3Store):
    """A bucket prefix seen through each view, reachable or not."""

    @pytest.fixture
    def store(self, moto: Moto, view: Callable[[Store], Store]) -> Store:
        self.client = moto.client()
        self.view = view
        return view(S3Store(f"s3://{BUCKET}/{uuid.uuid4().hex}/root"))

    def replica(self, store: Store) -> Store:
        return self.view(super().replica(store))

    @pytest.fixture
    def unreachable(self, moto: Moto, view: Callable[[Store], Store]) -> Iterator[Store]:
        with environment({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}):  # nothing listens there
            yield view(S3Store(f"s3://{BUCKET}/root", timeout=1.0, max_attempts=1))
