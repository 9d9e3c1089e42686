"""What ``zarr-gateway serve`` does before uvicorn starts: settings, their checks, logging and metrics.

Everything that can be wrong with the settings stops start-up here with a message that names it,
before a port is bound: an unknown setting, a data root that is not a directory, a tokens file that
cannot be used or still holds the example token, a port another server listens on. Then it logs which
optional features are off, one line for each missing extra.
"""

import errno
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from .extras import EXTRAS, MissingExtraError
from .logs import configure_logging
from .settings import ENV_PREFIX, Settings

log = logging.getLogger("gateway")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # the same name as gateway.metrics.MULTIPROC_ENV


def load_settings(flags: dict[str, Any]) -> Settings:
    """Flags over the environment over the settings file over the defaults; exits naming any problem."""
    try:
        return Settings(**flags)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        sys.exit(f"zarr-gateway: invalid settings: {problems}")
    except SettingsError as exc:
        sys.exit(f"zarr-gateway: invalid settings: {exc}")


# The placeholder of the example tokens files (deploy/): a token anyone can read there grants nothing.
EXAMPLE_TOKEN = "replace-with-a-long-random-token"


def check_tokens(settings: Settings) -> None:
    from .http.auth import Tokens, TokensFileError
    from .http.share import ShareKey, ShareKeyError, read_revocations

    if settings.share_key_file is not None:
        try:
            ShareKey.load(settings.share_key_file)
        except ShareKeyError as exc:
            sys.exit(f"zarr-gateway: {exc}")
    if settings.share_revoked_file is not None:
        try:
            read_revocations(settings.share_revoked_file)
        except (OSError, UnicodeDecodeError) as exc:
            sys.exit(f"zarr-gateway: share revocation list {settings.share_revoked_file} cannot be read: {exc}")
    if settings.tokens_file is not None:
        try:
            tokens = Tokens.load(settings.tokens_file)
        except TokensFileError as exc:
            sys.exit(f"zarr-gateway: {exc}")
        if tokens.grant(EXAMPLE_TOKEN) is not None:
            sys.exit(
                f"zarr-gateway: tokens file {settings.tokens_file}: the example token {EXAMPLE_TOKEN!r} is published "
                "in this project's repository; replace it with a long random one (python3 -c "
                "'import secrets; print(secrets.token_urlsafe(32))')"
            )


def check_sign_in(settings: Settings) -> None:
    """With an OpenID issuer: its extra installed, its secret files readable and not empty, the logout directory
    one the workers can write (the issuer itself is asked only when sign-in is first used: it may be away)."""
    if settings.oidc_issuer is None:
        return
    try:
        EXTRAS["oidc"].require("oidc_issuer")
    except MissingExtraError as exc:
        sys.exit(f"zarr-gateway: {exc}")
    for name in ("oidc_client_secret_file", "oidc_cookie_key_file"):
        path: Path | None = getattr(settings, name)
        if path is None:
            continue
        try:
            empty = not path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            sys.exit(f"zarr-gateway: {name} {str(path)!r} cannot be read: {getattr(exc, 'strerror', None) or exc}")
        if empty:
            sys.exit(f"zarr-gateway: {name} {str(path)!r} is empty")
    if settings.oidc_logout_dir is not None:
        try:
            settings.oidc_logout_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            sys.exit(f"zarr-gateway: oidc_logout_dir {str(settings.oidc_logout_dir)!r} cannot be made: {exc.strerror}")


def log_missing_features() -> None:
    """One line for each optional feature whose extra is not installed: what is off, why, and how to turn it on."""
    for extra in EXTRAS.values():
        reason = extra.missing()
        if reason is not None:
            log.info(
                "feature off: %s (extra %r not installed: %s; %s)",
                extra.provides,
                extra.name,
                reason,
                extra.install_hint(),
            )


def check_port(settings: Settings) -> None:
    """Stop with one line naming the address when the port cannot be listened on (in use, or not allowed).

    The servers would say it too, but uvicorn with several workers as a bare ``[Errno 98]`` without the port.
    """
    import socket

    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        sys.exit(f"zarr-gateway: host {settings.host!r} cannot be listened on: {exc.strerror}")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no obstacle
        try:
            probe.bind(address)
        except OSError as exc:
            hint = (
                " (is another server running there? choose another with --port)"
                if exc.errno == errno.EADDRINUSE
                else ""
            )
            sys.exit(f"zarr-gateway: cannot listen on {settings.host}:{settings.port}: {exc.strerror}{hint}")


def check_root(settings: Settings) -> None:
    """Say at start-up whether the data root and each remote root answer, and whether the root holds datasets.

    A store whose extra is not installed, or a URL it cannot be opened from, stops start-up naming it.
    Neither an empty root nor a silent store does: an empty root may be filled and a store may come
    back (as it may go away later); until the data root answers, /readyz reports not ready and data
    requests answer 503.

    Network stores are asked in a spawned process: obstore's runtime, once it has sent a request,
    leaves a forked child (a Granian worker) hanging on its first one.
    """
    from gateway_storage import read_headers_file, store_kind

    try:
        headers = read_headers_file(str(settings.store_headers_file)) if settings.store_headers_file else {}
    except ValueError as exc:
        sys.exit(f"zarr-gateway: store_headers_file: {exc}")
    roots = [(settings.root, "data root"), *((url, "remote root") for url in settings.remote_roots)]
    for url, what in roots:
        kind = store_kind(url)
        if kind is not None:
            try:
                EXTRAS[kind.extra].require(f"the {what} {url}")
            except MissingExtraError as exc:
                sys.exit(f"zarr-gateway: {exc}")
    if all(store_kind(url) is None for url, _ in roots):
        said = probe_roots(roots, headers)
    else:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as probe:
            said = probe.submit(probe_roots, roots, headers).result()
    for level, message in said:
        if level == "exit":
            sys.exit(message)
        log.log(logging.getLevelName(level), "%s", message)


def probe_roots(roots: list[tuple[str, str]], headers: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    """Open each root's store and ask it once: what start-up says, as (level, message); "exit" stops it."""
    from gateway_storage import LocalStore, Store, headers_for, store_kind

    from .sources.root_shape import misplaced_root

    said: list[tuple[str, str]] = []
    stores: list[tuple[str, str, Store]] = []
    for url, what in roots:
        kind = store_kind(url)
        try:
            store = (
                LocalStore(url.removeprefix("file://"))
                if kind is None
                else kind.open(url, timeout=5.0, max_attempts=1, headers=headers_for(url, headers))
            )
        except (ValueError, OSError) as exc:  # a URL no store can be opened from, obstore's configuration errors
            return [("exit", f"zarr-gateway: {what} {url}: {exc}")]
        stores.append((url, what, store))
    for url, what, store in stores:
        named = store.endpoint()
        endpoint = f" (endpoint {named})" if named else ""
        try:
            if what == "remote root":
                store.is_directory(store.root)
                said.append(("INFO", f"remote root {url} answers: mag and layer paths below it are served"))
                continue
            organizations = store.list_directories(store.root)
            hint = misplaced_root(store)
        except Exception as exc:
            then = (
                "its layers answer 503 until then"
                if what == "remote root"
                else "serving anyway, not ready until it answers"
            )
            said.append(("ERROR", f"{what} {url} cannot be reached{endpoint}: {exc}; {then}"))
            continue
        if hint is not None:
            said.append(("WARNING", f"data root {url}: {hint}"))
        elif organizations:
            said.append(("INFO", f"data root {url} answers{endpoint}: {len(organizations)} organizations"))
        else:
            said.append(("WARNING", f"data root {url}{endpoint} holds no datasets yet (no organization directories)"))
    return said


def prepare(settings: Settings) -> Callable[[], None]:
    """Configure logging, print the settings (no secrets), set up metrics files, hand settings to workers.

    Returns a clean-up function to call when the server has stopped.
    """
    configure_logging(settings.log_format)
    check_port(settings)
    check_tokens(settings)
    check_sign_in(settings)
    check_root(settings)
    log_missing_features()
    log.info("settings: %s", json.dumps(settings.public()))
    cleanup = _metrics_dir(settings)
    # Workers are separate processes: hand them the validated settings through the environment.
    os.environ.pop(f"{ENV_PREFIX}SETTINGS_FILE", None)
    for name, value in settings.model_dump(mode="json").items():
        if value is not None and name != "settings_file":
            os.environ[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return cleanup


def _metrics_dir(settings: Settings) -> Callable[[], None]:
    """Several workers share their metrics through files in one directory, emptied at start-up."""
    given = settings.metrics_dir or (Path(os.environ[MULTIPROC_ENV]) if os.environ.get(MULTIPROC_ENV) else None)
    if given is None and settings.workers == 1:
        return lambda: None
    if given is None:
        directory = Path(tempfile.mkdtemp(prefix="zarr-gateway-metrics-"))
        cleanup: Callable[[], None] = lambda: shutil.rmtree(directory, ignore_errors=True)  # noqa: E731
    else:
        directory = given
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob("*.db"):
                stale.unlink()
        except OSError as exc:
            sys.exit(f"zarr-gateway: metrics_dir {str(directory)!r} cannot be used: {exc.strerror}")
        cleanup = lambda: None  # noqa: E731
    os.environ[MULTIPROC_ENV] = str(directory)
    return cleanup
