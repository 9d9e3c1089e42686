"""Finding datasets and layers in a store: the organizations and datasets of the root, a mag's directory, and
the dataset that owns a path. Functions of the store they are given, which hold nothing."""

import errno
import posixpath

from gateway_storage import OutsideRootError, StorageError, Store, StoreUnavailableError, is_absolute_location
from gateway_storage.geometry import Vec3, mag_names
from gateway_storage.local import DATASET_DEPTH

from .dataset import Owner
from .formats import SourceFormat
from .mag import SourceError
from .paths import is_plain_name

PROPERTIES = "datasource-properties.json"


def organizations(storage: Store) -> list[str]:
    """The organizations of the root: its directories with plain names."""
    return [name for name in storage.list_directories(storage.root) if is_plain_name(name)]


def dataset_directory(storage: Store, organization: str, name: str) -> str:
    """Where a dataset lies: ``<root>/<organization>/<dataset>``, which holds its PROPERTIES."""
    return storage.join(storage.root, organization, name)


def dataset_names(storage: Store, organization: str) -> list[str]:
    """The names of the datasets of ``organization`` (directories with a properties file), loading none:
    what a listing filtered by grants, or an organization's authorization, needs."""
    if not is_plain_name(organization):
        return []
    directory = storage.join(storage.root, organization)
    return [
        name
        for name in storage.list_directories(directory)
        if is_plain_name(name) and _has_properties(storage, storage.join(directory, name, PROPERTIES))
    ]


def _has_properties(storage: Store, path: str) -> bool:
    try:
        return storage.identity(path) is not None
    except OutsideRootError:
        return True  # listed as a dataset that cannot be served


def owner_of(storage: Store, real: str) -> Owner | None:
    """The dataset whose directory holds the real path ``real``; None for an operator's extra root or a
    remote root (trusted as a whole). A path of the data root that lies in no dataset is not served."""
    if storage.root_of(real) != storage.root:
        return None
    parts = [part for part in storage.relative(real).split("/") if part][:DATASET_DEPTH]
    if len(parts) < DATASET_DEPTH:
        raise SourceError("its directory lies in no dataset's directory")
    return parts[0], parts[1]


def mag_directory(
    files: Store, directory: str, layer: str, mag: Vec3, path: str | None, source_format: SourceFormat
) -> str | None:
    """The resolved directory of a layer's mag that holds a mag of ``source_format``: the entry's ``path`` (an
    absolute location, or relative to the dataset's ``directory``) or else the layer's mag names; None if none."""
    if path is not None and is_absolute_location(path):
        located = files.locate(path)  # a local path, or a URL of the data root's store or a remote root
        candidates = [] if located is None else [located]
    elif path is not None:
        candidates = [files.join(directory, path.removeprefix("./"))]
    else:
        candidates = [files.join(directory, layer, name) for name in mag_names(mag)]
    # A path from the properties that no file can have (a NUL, an unpaired surrogate, too long for the system)
    # holds no mag: that mag's problem, not the whole dataset's.
    for candidate in candidates:
        try:
            resolved = files.resolve(candidate)
        except ValueError:  # a NUL or an unpaired surrogate (UnicodeEncodeError)
            continue
        try:
            if resolved is not None and source_format.holds_mag(resolved, files):
                return resolved
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise  # a storage fault, not a name
    return None


def away(files: Store, directory: str, layer: str, path: str | None) -> str | None:
    """Why a mag directory that was not found is away rather than absent, from the store: a symlink on its
    way below the dataset's directory whose target is gone (a volume not mounted); None if nothing says so.
    Looked up through the watched store, so the dataset is loaded again once the volume is back."""
    if path is not None and is_absolute_location(path):
        return None
    current = files.join(directory, path.removeprefix("./") if path else layer)
    while current.startswith(directory + "/"):
        try:
            files.identity(current)
        except StoreUnavailableError as exc:
            return f"{exc} (a volume that is away?)"
        except (OSError, StorageError, ValueError):  # ValueError: a name no file can have (a NUL, a surrogate)
            pass
        current = posixpath.dirname(current)
    return None


def not_found(files: Store, path: str | None) -> str:
    """Why a mag directory was not found: a URL the operator did not allow is said to be one."""
    located = files.locate(path) if path is not None and is_absolute_location(path) else None
    if path is not None and "://" in path and (located is None or files.resolve(located) is None):
        # a local path is not echoed: it would tell every reader where the server's files lie
        named = "its file:// path" if path.startswith("file://") else path
        return f"{named} is outside the data root and every remote root the gateway allows (setting remote_roots)"
    return "directory not found or outside the data root"
