"""Data safety: files rewritten in place, data that appears late, layers on other volumes.

Real gateway processes, real clients (requests, zarr-python), data written by the ``wkw`` package and
compared voxel by voxel.
"""

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import requests
import wkw
import zarr
from pydantic import ValidationError
from support.processes import wait_until
from support.rewrites import Answer, InPlaceWriter, assert_each_body_is_one_version, hammering, wait_until_served
from support.servers import Server

from gateway.settings import Settings
from gateway_storage import FileChangedError, FileUnsettledError, LocalStore

pytestmark = pytest.mark.slow  # files rewritten for seconds while they are read

ORG, DATASET = "org", "ds"
BLOCK = 32
FILE_LEN = 4  # blocks per file side: one file of 128^3 voxels, 64 raw blocks of 32 KiB
EDGE = BLOCK * FILE_LEN
WAIT_SECONDS = 60  # bound of every wait for the gateway to see a change (never a measured time)


# --- helpers ------------------------------------------------------------------------------------


def write_wkw(
    mag_dir: Path, data: np.ndarray, block_type: int = wkw.Header.BLOCK_TYPE_RAW, file_len: int = FILE_LEN
) -> None:
    """One mag written by the format authors' package, ``data`` as ``[c, x, y, z]`` from the origin."""
    header = wkw.Header(np.uint8, block_type=block_type, file_len=file_len)
    with wkw.Dataset.create(str(mag_dir), header) as dataset:
        dataset.write((0, 0, 0), data)


def random_volume(seed: int, edge: int = EDGE) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 255, size=(1, edge, edge, edge), dtype=np.uint8)


def write_properties(dataset_dir: Path, layers: dict[str, str | None], edge: int = EDGE) -> None:
    """A dataset of uint8 WKW color layers covering [0, edge)^3; a layer's mag path, if given, is used as is."""
    data_layers = []
    for name, path in layers.items():
        data_layers.append(
            {
                "name": name,
                "category": "color",
                "boundingBox": {"topLeft": [0, 0, 0], "width": edge, "height": edge, "depth": edge},
                "elementClass": "uint8",
                "dataFormat": "wkw",
                "mags": [{"mag": [1, 1, 1], **({"path": path} if path else {})}],
            }
        )
    document = {
        "id": {"name": dataset_dir.name, "team": ""},
        "scale": {"factor": [1.0, 1.0, 1.0], "unit": "nanometer"},
        "dataLayers": data_layers,
    }
    dataset_dir.mkdir(parents=True, exist_ok=True)
    (dataset_dir / "datasource-properties.json").write_text(json.dumps(document))


def serve(server_factory: Callable[..., Server], root: Path, **settings: object) -> Server:
    """A gateway whose settings come from a JSON settings file (lists and all)."""
    settings_file = root.parent / f"settings-{root.name}-{len(list(root.parent.glob('settings-*')))}.json"
    settings_file.write_text(json.dumps(settings))
    return server_factory(root, settings_file=settings_file)


def layer_url(server: Server, layer: str, tree: str = "zarr") -> str:
    return f"{server.url}/data/{tree}/{ORG}/{DATASET}/{layer}"


def decoded_chunk(body: bytes, edge: int) -> np.ndarray:
    voxels = np.frombuffer(numcodecs.Blosc().decode(body), dtype=np.uint8)
    return voxels.reshape((1, edge, edge, edge), order="F")


def truth_chunk(data: np.ndarray, key: str, edge: int) -> np.ndarray:
    x, y, z = (int(v) * edge for v in key.split(".")[1:])
    return data[:, x : x + edge, y : y + edge, z : z + edge]


# --- 5. files rewritten in place ----------------------------------------------------------------

REWRITE_FILE_LEN = 8  # a 16 MiB file: a write call takes long enough to be overlapped by reads
REWRITE_EDGE = BLOCK * REWRITE_FILE_LEN


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[np.ndarray], list[Path]]]:
    """A dataset whose one data file will be rewritten in place; the two versions' data and file bytes."""
    base = tmp_path_factory.mktemp("rewritten")
    versions = [random_volume(seed, REWRITE_EDGE) for seed in (1, 2)]
    copies = []
    for number, data in enumerate(versions):
        write_wkw(base / f"version{number}", data, file_len=REWRITE_FILE_LEN)
        copies.append(base / f"version{number}" / "z0" / "y0" / "x0.wkw")
    assert copies[0].stat().st_size == copies[1].stat().st_size  # raw blocks: the same size, as the rule needs
    root = base / "root"
    write_properties(root / ORG / DATASET, {"color": None}, REWRITE_EDGE)
    write_wkw(root / ORG / DATASET / "color" / "1", versions[0], file_len=REWRITE_FILE_LEN)
    yield root, versions, copies


def test_file_rewritten_in_place_is_never_served_mixed_under_one_etag(
    rewritten: tuple[Path, list[np.ndarray], list[Path]], server_factory: Callable[..., Server]
) -> None:
    """A writer process rewrites a data file in place while clients read it through two gateways.

    Every 200 body is exactly the old or exactly the new data of its chunk (one stored block passed
    through; eight blocks re-encoded), every ETag names one body, everything else is 503 with
    Retry-After, and once the writer stops the gateway serves the final version within seconds.
    The gateways run with the default settle time.
    """
    root, versions, copies = rewritten
    servers = {
        "pass-through": (serve(server_factory, root), 32),
        "eight blocks": (serve(server_factory, root, chunk_edge=64), 64),
    }
    keys = {
        # blocks late in the file's Morton order: the copy of a write call reaches them last
        "pass-through": ["0.7.7.7", "0.6.7.7", "0.7.6.7", "0.5.6.7"],
        "eight blocks": ["0.3.3.3", "0.2.3.3", "0.3.3.2", "0.1.2.3"],
    }
    target = root / ORG / DATASET / "color" / "1" / "z0" / "y0" / "x0.wkw"
    inode = target.stat().st_ino
    writer = InPlaceWriter(target, BLOCK**3, copies)
    targets = {name: (f"{layer_url(server, 'color')}/1", keys[name]) for name, (server, _) in servers.items()}
    settled_answers = []
    try:
        with hammering(targets) as answers:
            for final in (1, 0, 1):
                writer.burst(60, final)
                # The writer has stopped: the final version must come through, and only it.
                for name, (server, _) in servers.items():
                    for key in keys[name][:2]:
                        response = wait_until_served(f"{layer_url(server, 'color')}/1/{key}")
                        settled_answers.append((name, key, final, response))
    finally:
        writer.close()
    assert target.stat().st_ino == inode, "the writer must rewrite in place, not replace the file"

    for name, key, final, response in settled_answers:
        edge = servers[name][1]
        np.testing.assert_array_equal(decoded_chunk(response.content, edge), truth_chunk(versions[final], key, edge))

    def version_of(answer: Answer) -> list[int]:
        edge = servers[answer.server][1]
        chunk = decoded_chunk(answer.body, edge)
        return [n for n, data in enumerate(versions) if np.array_equal(chunk, truth_chunk(data, answer.key, edge))]

    assert_each_body_is_one_version(answers, version_of)

    # zarr-python reads the whole array as it now is: the last version, voxel by voxel.
    array = zarr.open_array(f"{layer_url(servers['pass-through'][0], 'color')}/1", mode="r")
    np.testing.assert_array_equal(array[:], versions[1])


def test_settle_rule_of_the_local_store(tmp_path: Path) -> None:
    """The rule itself: a fresh write is not trusted; a settled one, or one followed by utime or rename, is."""
    root = tmp_path / "root"
    root.mkdir()
    path = root / "file.bin"
    path.write_bytes(b"a" * 4096)
    store = LocalStore(str(root), settle_seconds=0.5)
    identity = store.identity(str(path))
    assert identity is not None
    with pytest.raises(FileUnsettledError) as raised:
        store.read(str(path), 0, 10, identity, limit=10)
    assert isinstance(raised.value, FileChangedError)  # what the HTTP layer retries, then answers 503
    assert 0 < raised.value.retry_after <= 0.5
    assert (
        LocalStore(str(root)).read(str(path), 0, 4, identity, limit=4) == b"aaaa"
    )  # 0 (the library default) trusts it
    assert store.read(str(path), 0, 4, identity, settled=False, limit=4) == b"aaaa"  # small files read whole

    def settled_read() -> bytes | None:
        try:
            return store.read(str(path), 0, 4, identity, limit=4)
        except FileUnsettledError:
            return None

    # once its last write is older than the settle time, the same file is served
    assert wait_until(settled_read, timeout=WAIT_SECONDS, interval=0.1) == b"aaaa"

    # rewritten in place after the read's identity was taken (same size): refused, never mixed
    with open(path, "r+b") as f:
        f.write(b"b" * 4096)
    with pytest.raises(FileChangedError):
        store.read(str(path), 0, 4, identity, limit=4)

    # a copy that keeps the source's time stamp (cp -p, rsync -t) was finished by its writer: trusted at once
    copied = root / "copied.bin"
    shutil.copy2(path, copied)
    st = copied.stat()
    assert st.st_ctime_ns != st.st_mtime_ns
    copied_identity = store.identity(str(copied))
    assert copied_identity is not None
    assert store.read(str(copied), 0, 4, copied_identity, limit=4) == b"bbbb"

    # the same bytes with a restored mtime are another version (ctime is part of the identity)
    before = store.identity(str(copied))
    os.utime(copied, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.identity(str(copied)) != before


def test_file_being_written_for_the_first_time_is_503_not_500(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """An upload in progress: a data file that exists but is still short reads as 'being written', not as corrupt."""
    root = tmp_path / "root"
    data = random_volume(5)
    write_properties(root / ORG / DATASET, {"color": None})
    mag_dir = root / ORG / DATASET / "color" / "1"
    write_wkw(mag_dir, data, wkw.Header.BLOCK_TYPE_LZ4)
    server = serve(server_factory, root, settle_seconds=3600)  # every write is "recent" to this gateway
    data_file = mag_dir / "z0" / "y0" / "x0.wkw"
    complete = data_file.read_bytes()
    with open(data_file, "r+b") as f:  # as a writer has it half-way: header written, jump table not yet
        f.truncate(40)
    response = requests.get(f"{layer_url(server, 'color')}/1/0.0.0.0", timeout=30)
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    assert "written" in response.json()["error"]  # being (re)written

    other = serve(server_factory, root, settle_seconds=0)  # a gateway that trusts every file: it is corrupt
    response = requests.get(f"{layer_url(other, 'color')}/1/0.0.0.0", timeout=30)
    assert response.status_code == 500 and "jump table" in response.json()["error"], response.text

    with open(data_file, "r+b") as f:
        f.write(complete)  # the writer finishes; its stamp is set back as rsync -t does: trusted at once
    st = data_file.stat()
    os.utime(data_file, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    response = requests.get(f"{layer_url(server, 'color')}/1/0.1.1.1", timeout=30)
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(decoded_chunk(response.content, 32), truth_chunk(data, "0.1.1.1", 32))


# --- 6. data that appears late, data on other volumes -------------------------------------------


def test_data_that_appears_late_is_served_without_a_restart(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """A layer symlinked to a volume that is not there yet, and a layer still being uploaded.

    The upload answers 404 'no servable layer' at first and the volume that is away a 503 (a storage
    fault, which clients must not fill with zeros); once the volume holds the data and the upload is
    written, both are served within seconds, and the properties file was never touched.
    """
    root, volume = tmp_path / "root", tmp_path / "volume"
    dataset_dir = root / ORG / DATASET
    write_properties(dataset_dir, {"mounted": None, "uploaded": None})
    (dataset_dir / "mounted").symlink_to(volume / "mounted", target_is_directory=True)  # dangling for now
    properties = (dataset_dir / "datasource-properties.json").stat()
    server = serve(server_factory, root, extra_roots=[str(volume)], settle_seconds=0)
    response = requests.get(f"{layer_url(server, 'uploaded')}/.zattrs", timeout=30)
    assert response.status_code == 404 and "no servable layer" in response.json()["error"], response.text
    response = requests.get(f"{layer_url(server, 'mounted')}/.zattrs", timeout=30)
    assert response.status_code == 503 and "volume that is away" in response.json()["error"], response.text
    listing = requests.get(f"{server.url}/data/zarr/{ORG}/{DATASET}/", timeout=30).text
    assert "mounted" in listing and "not found" in listing  # listed with the reason, not as a link

    truths = {"mounted": random_volume(11), "uploaded": random_volume(12)}
    volume.mkdir()  # the volume comes up
    write_wkw(volume / "mounted" / "1", truths["mounted"], wkw.Header.BLOCK_TYPE_LZ4HC)
    write_wkw(dataset_dir / "uploaded" / "1", truths["uploaded"])  # the upload lands in place

    for layer, truth in truths.items():
        wait_until_served(f"{layer_url(server, layer)}/1/0.3.2.1")  # 404 until reloaded, 503 while fresh
        array = zarr.open_array(f"{layer_url(server, layer)}/1", mode="r")
        np.testing.assert_array_equal(array[:], truth, err_msg=layer)
        v3 = zarr.open_array(f"{layer_url(server, layer, 'zarr3')}/1", mode="r")
        np.testing.assert_array_equal(v3[0, 40:90, 0:128, 100:128], truth[0, 40:90, 0:128, 100:128], err_msg=layer)
    assert (dataset_dir / "datasource-properties.json").stat().st_mtime_ns == properties.st_mtime_ns


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, np.ndarray]:
    """A root whose layers are symlinked to a trusted second volume and to an untrusted third one."""
    base = tmp_path_factory.mktemp("volumes")
    root, second, third = base / "root", base / "second", base / "third"
    data = random_volume(21)
    write_wkw(second / "color" / "1", data, wkw.Header.BLOCK_TYPE_LZ4HC)
    shutil.copytree(second / "color", third / "color")
    shutil.copytree(second / "color", second / "absolute")
    dataset_dir = root / ORG / DATASET
    write_properties(
        dataset_dir,
        {
            "on_second": None,
            "on_third": None,
            "absolute_second": str(second / "absolute" / "1"),  # mag paths may name another volume directly
            "absolute_third": str(third / "color" / "1"),
        },
    )
    (dataset_dir / "on_second").symlink_to(second / "color", target_is_directory=True)
    (dataset_dir / "on_third").symlink_to(third / "color", target_is_directory=True)
    return root, second, third, data


def test_extra_roots_are_trusted_and_nothing_else(
    volumes: tuple[Path, Path, Path, np.ndarray], server_factory: Callable[..., Server]
) -> None:
    root, second, _, data = volumes
    server = serve(server_factory, root, extra_roots=[str(second)], settle_seconds=0)
    for layer in ("on_second", "absolute_second"):
        array = zarr.open_array(f"{layer_url(server, layer)}/1", mode="r")
        np.testing.assert_array_equal(array[:], data, err_msg=layer)
    for layer in ("on_third", "absolute_third"):
        response = requests.get(f"{layer_url(server, layer)}/1/0.0.0.0", timeout=30)
        assert response.status_code == 404, response.text
        assert "outside the data root" in response.json()["error"], response.text

    plain = serve(server_factory, root, settle_seconds=0)  # without the setting, the second volume is outside too
    for layer in ("on_second", "absolute_second", "on_third", "absolute_third"):
        response = requests.get(f"{layer_url(plain, layer)}/1/0.0.0.0", timeout=30)
        assert response.status_code == 404 and "outside the data root" in response.json()["error"], layer


def test_replicas_mounting_a_volume_elsewhere_give_the_same_etags(
    volumes: tuple[Path, Path, Path, np.ndarray], tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """Two replicas see the same files of a second volume at different mount points: same bodies and ETags.

    The files are hard links (the same inodes, so the same identity), under different directories,
    as two machines mounting one volume at different paths would see them.
    """
    _, second, _, data = volumes
    replicas = []
    for number in (1, 2):
        mount = tmp_path / f"mount{number}"
        for source in (second / "color").rglob("*"):
            target = mount / "color" / source.relative_to(second / "color")
            if source.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(source, target)
        root = tmp_path / f"root{number}"
        write_properties(root / ORG / DATASET, {"color": None})
        (root / ORG / DATASET / "color").symlink_to(mount / "color", target_is_directory=True)
        replicas.append(serve(server_factory, root, extra_roots=[str(mount)], v3_layout="sharded", settle_seconds=0))
    paths = ["zarr/{ds}/color/1/0.1.2.3", "zarr/{ds}/color/1/0.0.0.0", "zarr3/{ds}/color/1/c/0/0/0/0"]
    for path in paths:
        url = path.format(ds=f"{ORG}/{DATASET}")
        first, other = (requests.get(f"{replica.url}/data/{url}", timeout=30) for replica in replicas)
        assert first.status_code == other.status_code == 200, (first.text, other.text)
        assert first.content == other.content, url
        assert first.headers["ETag"] == other.headers["ETag"], url
    chunk = requests.get(f"{replicas[0].url}/data/zarr/{ORG}/{DATASET}/color/1/0.1.2.3", timeout=30)
    np.testing.assert_array_equal(decoded_chunk(chunk.content, 32), truth_chunk(data, "0.1.2.3", 32))


def test_settings_of_this_behaviour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """extra_roots: PATH-style text or a JSON list, absolute paths only, local roots only; settle_seconds >= 0."""
    monkeypatch.setenv("ZARR_GATEWAY_EXTRA_ROOTS", f"{tmp_path}/a:{tmp_path}/b")
    settings = Settings(root=str(tmp_path))
    assert settings.extra_roots == (f"{tmp_path}/a", f"{tmp_path}/b")
    # start-up hands settings to the workers as text; it must read back the same
    monkeypatch.setenv("ZARR_GATEWAY_EXTRA_ROOTS", settings.model_dump(mode="json")["extra_roots"])
    assert Settings(root=str(tmp_path)).extra_roots == settings.extra_roots
    monkeypatch.delenv("ZARR_GATEWAY_EXTRA_ROOTS")
    assert Settings.model_validate({"root": str(tmp_path), "extra_roots": f'["{tmp_path}/c"]'}).extra_roots == (
        f"{tmp_path}/c",
    )
    assert Settings(root=str(tmp_path)).settle_seconds > 0
    with pytest.raises(ValidationError, match="absolute"):
        Settings.model_validate({"root": str(tmp_path), "extra_roots": "relative/dir"})
    with pytest.raises(ValidationError, match="local data root"):
        Settings.model_validate({"root": "s3://bucket/prefix", "extra_roots": [str(tmp_path)]})
    with pytest.raises(ValidationError):
        Settings(root=str(tmp_path), settle_seconds=-1)
