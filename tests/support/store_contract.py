"""The store contract: what every store of the storage kernel must do, whatever holds the bytes.

In the manner of zarr-python's ``StoreTests``: :class:`StoreContract` states the contract as tests,
and each store's test module subclasses it (as ``Test...``) with fixtures that make a store over a
fresh root and write files into it the store's own way. A store that can be unreachable (a network
service) subclasses :class:`UnreachableStoreContract`. :class:`LocalStoreContract` is the contract
of a local directory, which a store that routes local paths to a local store also meets.
"""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from gateway_storage import (
    FileChangedError,
    LocalStore,
    OutsideRootError,
    OversizedFileError,
    OversizedListingError,
    StorageError,
    Store,
    StoreUnavailableError,
    TruncatedFileError,
)

DATA = bytes(range(256)) * 16  # 4 KiB, every byte value, so an offset mistake shows


class StoreContract:
    """The tests every store passes. Subclasses provide the fixtures and the three writing hooks."""

    # Whether the gateway writes into the store (batch results); a store that is not refuses with a StorageError.
    writable = True

    # --- what a subclass provides -----------------------------------------------------------------

    @pytest.fixture
    def store(self) -> Store:
        """A store over a fresh, empty root."""
        raise NotImplementedError

    def write(self, store: Store, name: str, data: bytes) -> str:
        """Put ``data`` at ``name`` (slash-separated, below the root) the store's own way; its path."""
        raise NotImplementedError

    def outside(self, store: Store, name: str, data: bytes) -> str:
        """A path that names ``data`` stored outside the store's root (a symlink out, a key past the prefix)."""
        raise NotImplementedError

    def replica(self, store: Store) -> Store:
        """A second store over a copy of the same files, at another root (another mount, another prefix)."""
        raise NotImplementedError

    # --- the contract ---------------------------------------------------------------------------

    def path(self, store: Store, *names: str) -> str:
        return store.join(store.root, *names)

    def test_the_identity_of_a_missing_file_is_none(self, store: Store) -> None:
        assert store.identity(self.path(store, "absent.bin")) is None
        assert store.identity(self.path(store, "no", "such", "directory", "file.bin")) is None
        assert store.read_whole(self.path(store, "absent.bin"), limit=1 << 20) is None

    def test_reads_return_exactly_the_bytes_at_an_offset(self, store: Store) -> None:
        path = self.write(store, "org/ds/data.bin", DATA)
        identity = store.identity(path)
        assert identity is not None and identity.size == len(DATA)
        for offset, size in ((0, 16), (1, 1), (255, 513), (len(DATA) - 7, 7), (0, len(DATA))):
            assert store.read(path, offset, size, identity, limit=size) == DATA[offset : offset + size]
        assert store.read(path, 100, 0, identity, limit=0) == b""

    def test_a_changed_file_raises_the_changed_error(self, store: Store) -> None:
        path = self.write(store, "org/ds/data.bin", DATA)
        before = store.identity(path)
        assert before is not None
        assert store.read(path, 0, 8, before, limit=8) == DATA[:8]
        self.write(store, "org/ds/data.bin", b"rewritten" + DATA)
        after = store.identity(path)
        assert after is not None and after != before
        with pytest.raises(FileChangedError):
            store.read(path, 0, 8, before, limit=8)  # the version asked for is gone: never the new bytes
        assert store.read(path, 0, 9, after, limit=9) == b"rewritten"

    def test_a_short_file_raises_the_truncated_error(self, store: Store) -> None:
        path = self.write(store, "org/ds/short.bin", DATA[:100])
        identity = store.identity(path)
        assert identity is not None
        with pytest.raises(TruncatedFileError):
            store.read(path, 50, 100, identity, limit=100)

    def test_paths_outside_the_root_are_refused(self, store: Store) -> None:
        secret = b"secret outside the root"
        path = self.outside(store, "org/ds/escape.bin", secret)
        assert store.resolve(path) is None
        with pytest.raises(OutsideRootError):
            store.identity(path)
        with pytest.raises(OutsideRootError):
            store.read_whole(path, limit=1 << 20)

    def test_read_whole_gives_the_bytes_and_their_identity(self, store: Store) -> None:
        path = self.write(store, "org/ds/meta.json", b'{"a": 1}')
        found = store.read_whole(path, limit=1 << 20)
        assert found is not None
        data, identity = found
        assert data == b'{"a": 1}'
        assert identity == store.identity(path)

    def test_reads_past_the_caller_s_limit_are_refused_before_they_happen(self, store: Store) -> None:
        path = self.write(store, "org/ds/data.bin", DATA)
        identity = store.identity(path)
        assert identity is not None
        with pytest.raises(OversizedFileError):
            store.read(path, 0, 1024, identity, limit=1023)
        with pytest.raises(OversizedFileError):
            store.read_whole(path, limit=len(DATA) - 1)
        found = store.read_whole(path, limit=len(DATA))
        assert found is not None and found[0] == DATA

    def test_listing_names_the_subdirectories_sorted_without_hidden_ones(self, store: Store) -> None:
        for name in ("b/x.bin", "a/x.bin", "c/deeper/x.bin", ".hidden/x.bin", "file.bin"):
            self.write(store, name, b"x")
        assert store.list_directories(store.root) == ["a", "b", "c"]
        assert store.list_directories(self.path(store, "c")) == ["deeper"]
        assert store.list_directories(self.path(store, "nothing")) == []
        assert store.is_directory(self.path(store, "c", "deeper"))
        assert not store.is_directory(self.path(store, "nothing"))

    def test_a_file_listing_names_every_file_below_with_its_version_and_is_bounded(self, store: Store) -> None:
        """What a data stamp is made of: every file at any depth, its path below the directory, and an identity
        that a rewrite of the same size changes; past the caller's bound, a refusal rather than more lookups."""
        for name in ("z0/y0/x1.bin", "z0/y0/x0.bin", "header.bin"):
            self.write(store, f"org/ds/mag/{name}", DATA)
        self.write(store, "org/ds/beside.bin", DATA)  # not below the directory listed
        mag = self.path(store, "org", "ds", "mag")
        listed = store.list_files(mag, limit=100)
        assert listed is not None
        assert [found.path for found in listed] == ["header.bin", "z0/y0/x0.bin", "z0/y0/x1.bin"], listed
        assert [found.identity.size for found in listed] == [len(DATA)] * 3
        self.write(store, "org/ds/mag/z0/y0/x0.bin", DATA[::-1])  # the same size, other bytes
        again = store.list_files(mag, limit=100)
        assert again is not None and [found.path for found in again] == [found.path for found in listed]
        assert again[1].identity.version != listed[1].identity.version
        assert [again[0].identity.version, again[2].identity.version] == [
            listed[0].identity.version,
            listed[2].identity.version,
        ]
        with pytest.raises(OversizedListingError):
            store.list_files(mag, limit=2)
        assert store.list_files(self.path(store, "nothing", "here"), limit=10) == []

    def test_a_written_file_is_read_back_whole_and_deleted(self, store: Store) -> None:
        """What batch runs publish results with (an index, a mesh set's shards and stamp, block outputs)."""
        path = self.path(store, "org", "ds", "layer.meshes", "stamp.json")
        if not self.writable:
            with pytest.raises(StorageError):
                store.write(path, DATA)
            return
        store.write(path, DATA)
        found = store.read_whole(path, limit=len(DATA))
        assert found is not None and found[0] == DATA
        store.write(path, b"again")
        found = store.read_whole(path, limit=len(DATA))
        assert found is not None and found[0] == b"again"
        store.delete(path)
        store.delete(path)  # already gone: nothing to do
        assert store.identity(path) is None

    def test_join_and_resolve_stay_inside_the_root(self, store: Store) -> None:
        path = self.write(store, "org/ds/layer/file.bin", b"x")
        assert path == self.path(store, "org", "ds", "layer", "file.bin")
        assert store.resolve(path) == path
        assert store.root_of(path) == store.root
        assert store.relative(path) == "org/ds/layer/file.bin"
        assert store.resolve(self.path(store, "org", "..", "..", "elsewhere")) is None

    def test_paths_relative_to_the_root_are_equal_on_replicas(self, store: Store) -> None:
        names = ["org/ds/layer/1/a.bin", "org/ds/layer/2/b.bin"]
        for name in names:
            self.write(store, name, DATA)
        other = self.replica(store)
        assert other.root != store.root
        for name in names:
            mine, theirs = self.path(store, *name.split("/")), self.path(other, *name.split("/"))
            assert store.relative(store.resolve(mine) or "") == other.relative(other.resolve(theirs) or "") == name
            mine_identity, their_identity = store.identity(mine), other.identity(theirs)
            assert mine_identity is not None and their_identity is not None
            assert mine_identity.size == their_identity.size
            assert other.read(theirs, 10, 20, their_identity, limit=20) == store.read(
                mine, 10, 20, mine_identity, limit=20
            )


class UnreachableStoreContract(StoreContract):
    """For stores that are services: one that does not answer raises the unavailable error, never "absent"."""

    @pytest.fixture
    def unreachable(self) -> Store:
        """A store whose service does not answer."""
        raise NotImplementedError

    def test_an_unreachable_store_raises_the_unavailable_error(self, unreachable: Store) -> None:
        path = self.path(unreachable, "org", "ds", "data.bin")
        with pytest.raises(StoreUnavailableError):
            unreachable.identity(path)
        with pytest.raises(StoreUnavailableError):
            unreachable.read_whole(path, limit=1 << 20)
        with pytest.raises(StoreUnavailableError):
            unreachable.list_directories(unreachable.root)


# --- a local directory -------------------------------------------------------------------------------


class LocalStoreContract(StoreContract):
    """A local root. A local disk is unreachable where a file is missing that cannot be absent: a root that is
    not mounted, a dangling symlink, or a mag directory that went; those are StoreUnavailableError, never None."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        (tmp_path / "root").mkdir()
        return LocalStore(str(tmp_path / "root"))

    def write(self, store: Store, name: str, data: bytes) -> str:
        path = Path(store.root, *name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)  # a new inode, as a writer that replaces a file makes
        return str(path)

    def outside(self, store: Store, name: str, data: bytes) -> str:
        target = Path(store.root).parent / f"outside-{uuid.uuid4().hex}.bin"
        target.write_bytes(data)
        link = Path(store.root, *name.split("/"))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        return str(link)

    def test_a_rewrite_in_place_that_puts_size_and_mtime_back_is_listed_as_another_version(self, store: Store) -> None:
        """As a copy that keeps times (``rsync -t``, ``cp -p``) or a writer that restores them: the change time
        still moves, so a data stamp sees the new bytes."""
        path = Path(self.write(store, "org/ds/mag/x0.bin", DATA))
        before = path.stat()
        listed = store.list_files(str(path.parent), limit=10)
        with open(path, "r+b") as rewrite:  # the same inode, the same size
            rewrite.write(DATA[::-1])
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = path.stat()
        assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
        again = store.list_files(str(path.parent), limit=10)
        assert listed is not None and again is not None
        assert again[0].identity.version != listed[0].identity.version

    def replica(self, store: Store) -> Store:
        copy = Path(store.root).parent / f"replica-{uuid.uuid4().hex}"
        shutil.copytree(store.root, copy, symlinks=True)
        return LocalStore(str(copy))

    def test_a_directory_swapped_for_a_symlink_out_of_the_root_is_refused(self, store: Store) -> None:
        """Checked on every new version opened, not remembered: the swap after a first read is seen."""
        path = self.write(store, "org/ds/z0/data.bin", DATA)
        identity = store.identity(path)
        assert identity is not None and store.read(path, 0, 4, identity, limit=4) == DATA[:4]
        outside = Path(store.root).parent / "outside-z0"
        outside.mkdir()
        (outside / "data.bin").write_bytes(b"secret" * 100)
        directory = Path(path).parent
        shutil.rmtree(directory)
        directory.symlink_to(outside)
        with pytest.raises(OutsideRootError):
            store.identity(path)
        with pytest.raises(OutsideRootError):
            store.read(path, 0, 6, identity._replace(version="another"), limit=6)

    def test_a_symlink_to_an_extra_root_is_served(self, tmp_path: Path) -> None:
        root, extra = tmp_path / "root", tmp_path / "volume2"
        (root / "org" / "ds").mkdir(parents=True)
        (extra / "layer").mkdir(parents=True)
        (extra / "layer" / "data.bin").write_bytes(DATA)
        (root / "org" / "ds" / "layer").symlink_to(extra / "layer")
        store = LocalStore(str(root), extra_roots=[str(extra)])
        path = str(root / "org" / "ds" / "layer" / "data.bin")
        found = store.read_whole(path, limit=1 << 20)
        assert found is not None and found[0] == DATA
        assert store.relative(store.resolve(path) or "") == "layer/data.bin"  # relative to the extra root
        with pytest.raises(OutsideRootError):
            LocalStore(str(root)).read_whole(path, limit=1 << 20)  # the same link without the extra root

    def test_a_dangling_symlink_is_unavailable_not_absent(self, store: Store) -> None:
        link = Path(store.root, "org", "ds", "0.0.0")
        link.parent.mkdir(parents=True)
        link.symlink_to(link.parent / "moved-away")
        with pytest.raises(StoreUnavailableError, match="symlink whose target is gone"):
            store.identity(str(link))
        with pytest.raises(StoreUnavailableError, match="symlink whose target is gone"):
            store.read_whole(str(link), limit=1 << 20)

    def test_a_root_that_went_is_unavailable_not_empty(self, store: Store) -> None:
        path = self.write(store, "org/ds/data.bin", DATA)
        store.require_directory(str(Path(path).parent))  # there: nothing to say
        os.rename(store.root, store.root + "-unmounted")
        for call in (
            lambda: store.identity(path),
            lambda: store.read_whole(path, limit=1 << 20),
            lambda: store.list_directories(self.path(store, "org")),
            lambda: store.require_directory(str(Path(path).parent)),
        ):
            with pytest.raises(StoreUnavailableError, match="data root"):
                call()

    def test_a_directory_that_must_be_there_and_went_is_unavailable(self, store: Store) -> None:
        path = self.write(store, "org/ds/mag/data.bin", DATA)
        shutil.rmtree(Path(path).parent)
        assert store.identity(path) is None  # absent inside a directory of the root, as far as a lookup tells
        with pytest.raises(StoreUnavailableError, match="not there"):
            store.require_directory(str(Path(path).parent))

    def test_a_fifo_in_the_root_is_refused_without_waiting_for_a_writer(self, store: Store) -> None:
        path = Path(store.root, "org", "ds", "zarr.json")
        path.parent.mkdir(parents=True)
        os.mkfifo(path)
        identity = store.identity(str(path))
        assert identity is not None
        with pytest.raises(OSError, match="not a regular file"):
            store.read_whole(str(path), limit=1 << 20)
        with pytest.raises(OSError, match="not a regular file"):
            store.read(str(path), 0, 1, identity, limit=1)

    def test_the_refusal_names_the_path_relative_to_the_root(self, store: Store) -> None:
        path = self.outside(store, "org/ds/escape.bin", b"secret")
        with pytest.raises(OutsideRootError) as raised:
            store.identity(path)
        assert str(raised.value) == "org/ds/escape.bin resolves outside the data root"
        assert store.root not in str(raised.value)
