"""All settings in one model.

Precedence, highest first: command-line flags (passed as keyword arguments), environment variables
(``ZARR_GATEWAY_*``), a settings file (``--settings-file`` / ``ZARR_GATEWAY_SETTINGS_FILE``: JSON, or
``.env`` style ``KEY=VALUE`` lines), then the defaults. An unknown setting in the environment or in
the file stops start-up with a message that names it.
"""

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    FieldSerializationInfo,
    SecretStr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from gateway_storage import remote_schemes, store_kind

# dask's dashboard of a batch run: loopback only, unless the operator says otherwise (it has no login).
DASK_DASHBOARD_ADDRESS = "127.0.0.1:8787"

CHUNK_EDGE_STEP = 32  # the WKW block edge webKnossos writes; served chunks are whole blocks
MAX_CHUNK_EDGE = 1024
ENV_PREFIX = "ZARR_GATEWAY_"

# Defaults that code below the settings also bounds itself by where no settings reach it (a batch run, stored
# meshes), defined here so that the settings import nothing of the project's higher layers.
# Meshing per request, from its first box (a scan of a layer without an index is bounded by the segment index's
# SCAN_VOXELS, shared by the requests that wait for it, and not counted): checked before each box, so one box
# more at most. The default of the ``mesh_seconds`` setting.
MESH_SECONDS = 60.0
# The data stamp walks at most this many files and directories per mag (the default of the ``stamp_files``
# setting): a mag of more (planted empty files) is refused with that reason rather than walked on and on.
STAMP_FILES = 100_000

# The codecs chunks may be encoded with, by name: the members of gateway.zarr.codecs.Codec, which encodes them.
CodecName = Literal["none", "blosc-lz4", "blosc-zstd", "zstd", "gzip"]

# The list settings and the separator of their text form (an environment variable, a KEY=VALUE line; a JSON
# list is read as one): PATH-style for paths, whose items are kept as given; ',' for URLs and addresses
# (URLs hold ':'), whose items are stripped of blanks.
LIST_SEPARATORS = {"trusted_proxies": ",", "extra_roots": os.pathsep, "remote_roots": ","}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", env_ignore_empty=True)

    root: str = Field(
        description="data root: a directory, file:// URL or store URL (s3://bucket/prefix, gs://bucket/prefix, "
        "az://container/prefix, https://host/prefix) holding <organization>/<dataset>/datasource-properties.json"
    )
    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8000, ge=0, le=65535, description="port to listen on")
    tokens_file: Path | None = Field(default=None, description="JSON tokens file; without it the gateway is open")
    workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1, description="worker processes; default: one per core"
    )
    server: Literal["uvicorn", "granian"] = Field(
        default="uvicorn", description="the HTTP server that runs the workers: uvicorn or granian"
    )
    codec: CodecName = Field(default="blosc-lz4", description="codec of chunks that are not passed through")
    chunk_edge: int = Field(default=32, description="edge of served chunks in voxels")
    v3_layout: Literal["plain", "sharded"] = Field(default="plain", description="v3 arrays: plain chunks or shards")
    cache_bytes: int = Field(default=256 << 20, ge=0, description="bound of the header/jump-table/shard cache")
    answer_cache_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="bound of the chunk answers each worker keeps while the files they were made from are "
        "unchanged (0: none are kept)",
    )
    cache_control: str = Field(default="no-cache", description="Cache-Control of every data response")
    threads: int = Field(
        default_factory=lambda: max(4, 2 * (os.cpu_count() or 1)),
        ge=1,
        description="threads per worker that read and encode chunks; default: two per core, at least 4",
    )
    mesh_threads: int = Field(
        default=1,
        ge=1,
        description="threads per worker that make meshes and previews, apart from those that serve chunks "
        "(the mesher holds the interpreter while it runs: more threads serve chunks less evenly)",
    )
    chunk_memory_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="memory that the chunks one worker produces at once may hold (decoded blocks, the chunk, "
        "its encoded copy) and the chunk answers it keeps; requests beyond it wait their turn, and a chunk that would "
        "hold more than all of it is refused (413) before any work; 0: no bound",
    )
    settings_file: Path | None = Field(default=None, description="JSON or KEY=VALUE file of settings")
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="log lines as text a person reads (auto: when standard error is a terminal) or as JSON "
        "objects, one a line, for a log collector (auto: otherwise)",
    )
    drain_seconds: float = Field(
        default=0, ge=0, description="after SIGTERM, /readyz fails for this long before the listener closes"
    )
    graceful_timeout: float = Field(
        default=30, gt=0, description="after the listener closes, in-flight requests get this long to finish"
    )
    metrics_dir: Path | None = Field(
        default=None, description="prometheus multiprocess directory (workers > 1); a fresh temporary one if unset"
    )
    tokens_reload_seconds: float = Field(
        default=2, ge=0, description="how often a changed tokens file is re-read; 0 never re-reads it"
    )
    share_key_file: Path | None = Field(
        default=None,
        description="file of the secret (at least 32 bytes) that signs share links (/s/{link}/...); without it "
        "no link is issued or accepted. Replicas with the same key accept each other's links",
    )
    share_revoked_file: Path | None = Field(
        default=None, description="revoked share link ids, one a line ('share --revoke ID' adds one); re-read as tokens"
    )
    share_max_seconds: int = Field(
        default=7 * 24 * 3600, ge=1, description="the longest a share link made from a dataset page may last"
    )
    neuroglancer_url: str = Field(
        default="",
        description="the Neuroglancer client that pages link to (its state follows in the #! fragment); empty: the "
        "gateway's own at /neuroglancer/ (the viewer extra), else the public https demo",
    )
    settle_seconds: float = Field(
        # Long enough for a write call under way to have finished (see wkw_adapter.LocalStore), short
        # enough that new data still shows up at once to a person looking at it.
        default=1.0,
        ge=0,
        description="a data file last written less than this long ago may still be being rewritten in place: "
        "answered 503 with Retry-After until it is older; 0 trusts every file at once",
    )
    public_url: str | None = Field(
        default=None,
        description="the URL clients reach the gateway at (e.g. https://zarr.example.org), for the absolute URLs "
        "of dataset pages; unset, the request's Host (or a trusted proxy's X-Forwarded-Host) is used",
    )
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="addresses or networks (CIDR) of the proxies whose X-Forwarded-Proto/-Host are believed, "
        "separated by ',' or a JSON list; anyone else's are ignored (default: none)",
    )
    max_header_bytes: int = Field(
        default=32 << 10,
        ge=8192,
        description="longest request line and headers together, in bytes; a longer request is answered 431",
    )
    header_timeout: float = Field(
        default=10,
        gt=0,
        description="seconds a client has to send a request's line and headers (also the idle limit of a "
        "connection between requests) before the connection is closed",
    )
    extra_roots: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="further directories that layers of a local data root may be symlinked to (other volumes); "
        "absolute paths separated by ':' or a JSON list",
    )
    segment_index_dir: Path | None = Field(
        default=None,
        description="directory of the segment indexes that index-segments writes, as <org>/<dataset>/<layer>"
        ".segment-index.npz; unset: beside each layer (<dataset>/<layer>.segment-index.npz), for a writable root",
    )
    dask_dashboard_address: str = Field(
        default=DASK_DASHBOARD_ADDRESS,
        description="where index-segments and mesh-segments --workers serve dask's dashboard (host:port; another "
        "port if that one is taken; none: no dashboard); loopback unless set otherwise",
    )
    dask_scheduler_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="port of the dask scheduler that index-segments and mesh-segments --workers start, on loopback "
        "(0: any free port)",
    )
    dask_worker_ports: str = Field(
        default="",
        pattern=r"^(\d{1,5}(:\d{1,5})?)?$",
        description="ports of those dask workers, on loopback: a range FIRST:LAST with two ports per worker (its "
        "nanny's and its own), or one port for a single worker; empty: any free ports",
    )
    multires_voxels: int | None = Field(
        default=None,
        ge=0,
        description="voxels one multi-resolution mesh made on demand may read (every level of one segment); a "
        "larger segment is served from the layer's stored mesh set (mesh-segments), else gets on demand the coarse "
        "levels whose reads fit (413 where none does); unset: 134217728 (128 Mi)",
    )
    mesh_seconds: float = Field(
        default=MESH_SECONDS,
        gt=0,
        description="seconds of meshing one mesh request may take, checked before each box it meshes; past them "
        "the work stops and the answer is a 503 with Retry-After and the reason",
    )
    stamp_files: int = Field(
        default=STAMP_FILES,
        ge=1,
        description="files and directories the data stamp of a segmentation layer walks per mag (it tells whether "
        "segment lists, indexes and meshes still describe the data); a mag of more is refused: its meshes and "
        "segment lists answer 413 with the reason",
    )
    remote_roots: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="store URLs (s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, https://host/prefix) "
        "that mag and "
        "layer paths in datasource-properties.json may point below, read with the gateway's credentials; "
        "a path to any other URL is refused; separated by ',' or a JSON list",
    )
    store_headers_file: Path | None = Field(
        default=None,
        description='JSON file of HTTP headers for stores by URL prefix, {"https://host/prefix": '
        '{"Authorization": "Bearer ..."}}: a store whose root lies below a prefix sends its headers',
    )

    oidc_issuer: str | None = Field(
        default=None,
        description="OpenID Connect issuer URL (its /.well-known/openid-configuration is read): sign-in at /login "
        'and Bearer access tokens, granted by the tokens file\'s "claims" (needs tokens_file and oidc_client_id)',
    )
    oidc_client_id: str | None = Field(default=None, description="the gateway's client id at the OpenID issuer")
    oidc_client_secret_file: Path | None = Field(
        default=None,
        description="file holding the client secret (none: a public client, PKCE only); also the login cookies' "
        "signing key unless oidc_cookie_key_file is set",
    )
    oidc_cookie_key_file: Path | None = Field(
        default=None, description="file holding the key that signs login cookies (needed for a public client)"
    )
    oidc_audience: str | None = Field(
        default=None, description="the aud an access token must name; unset: the client id"
    )
    oidc_scope: str = Field(
        default="openid email profile", description="the scopes /login asks the issuer for (the claims they bring)"
    )
    oidc_login_seconds: float = Field(
        default=8 * 3600, gt=0, description="how long a sign-in at /login lasts (its cookie's lifetime)"
    )
    oidc_jwks_refresh_seconds: float = Field(
        default=60,
        ge=0,
        description="least time between two fetches of the issuer's keys for a token signed by an unknown key",
    )
    oidc_logout_dir: Path | None = Field(
        default=None,
        description="directory where /logout records ended sign-ins, shared by the workers (a shared volume for "
        "replicas); unset: one in the system's temporary directory",
    )

    @field_validator("chunk_edge")
    @classmethod
    def _chunk_edge(cls, edge: int) -> int:
        if edge < CHUNK_EDGE_STEP or edge > MAX_CHUNK_EDGE or edge % CHUNK_EDGE_STEP:
            raise ValueError(
                f"chunk_edge must be a multiple of {CHUNK_EDGE_STEP} from {CHUNK_EDGE_STEP} to {MAX_CHUNK_EDGE} "
                f"(32, 64, 128, 256, ...), got {edge}"
            )
        return edge

    @field_validator("neuroglancer_url")
    @classmethod
    def _neuroglancer_url(cls, url: str) -> str:
        if not url:
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment:
            raise ValueError(f"neuroglancer_url must be an http(s) URL without a #fragment, got {url!r}")
        return url

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"public_url must be an http(s) URL without query or #fragment, got {url!r}")
        if any(c in url for c in "\"'<>` ") or not url.isprintable():
            raise ValueError(f"public_url must not hold quotes, brackets, blanks or control characters, got {url!r}")
        return url.rstrip("/")

    @field_validator(*LIST_SEPARATORS, mode="before")
    @classmethod
    def _split_list(cls, value: Any, info: ValidationInfo) -> Any:
        """A list setting from its text form: a JSON list, or items between the field's separator."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            return json.loads(value)
        separator = LIST_SEPARATORS[str(info.field_name)]
        parts = value.split(separator)
        return [part if separator == os.pathsep else part.strip() for part in parts if part.strip()]

    @field_serializer(*LIST_SEPARATORS)
    def _join_list(self, items: tuple[str, ...], info: FieldSerializationInfo) -> str:
        """The text form that start-up hands to the workers through the environment."""
        return LIST_SEPARATORS[info.field_name].join(items)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, proxies: tuple[str, ...]) -> tuple[str, ...]:
        for proxy in proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted_proxies: {proxy!r} is not an address or a network such as 10.0.0.0/8"
                ) from None
        return proxies

    @field_validator("extra_roots")
    @classmethod
    def _absolute_roots(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        # Not required to exist yet: a volume may be mounted after the gateway starts.
        relative = [root for root in roots if not os.path.isabs(root.removeprefix("file://"))]
        if relative:
            raise ValueError(f"extra_roots must be absolute paths, got {', '.join(map(repr, relative))}")
        return tuple(root.removeprefix("file://") for root in roots)

    @field_validator("remote_roots")
    @classmethod
    def _store_urls(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        schemes = ", ".join(f"{scheme}://" for scheme in remote_schemes())
        wrong = [r for r in roots if r.partition("://")[0] not in remote_schemes() or not urlsplit(r).netloc]
        if wrong:
            raise ValueError(f"remote_roots must be URLs of {schemes}, got {', '.join(map(repr, wrong))}")
        return tuple(root.rstrip("/") for root in roots)

    @model_validator(mode="after")
    def _extra_roots_are_local(self) -> "Settings":
        if self.extra_roots and store_kind(self.root) is not None:
            raise ValueError(
                f"extra_roots apply to a local data root, not to {self.root.partition('://')[0]}:// "
                "(objects cannot be symlinked)"
            )
        return self

    @field_validator("oidc_issuer")
    @classmethod
    def _oidc_issuer(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
        if not parts.netloc or parts.query or parts.fragment or not (parts.scheme == "https" or loopback):
            raise ValueError(f"oidc_issuer must be an https URL (http only on loopback) without query, got {url!r}")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _oidc_complete(self) -> "Settings":
        if self.oidc_issuer is None:
            return self
        if self.oidc_client_id is None or self.tokens_file is None:
            raise ValueError('oidc_issuer needs oidc_client_id and tokens_file (whose "claims" grant datasets)')
        if self.oidc_client_secret_file is None and self.oidc_cookie_key_file is None:
            raise ValueError("a public OIDC client (no oidc_client_secret_file) needs oidc_cookie_key_file")
        return self

    @field_validator("root")
    @classmethod
    def _root_exists(cls, root: str) -> str:
        if store_kind(root) is not None:
            return root
        if not Path(root.removeprefix("file://")).is_dir():
            raise ValueError(f"data root {root!r} is not a directory")
        return root

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _StrictEnvSource(settings_cls), _SettingsFileSource(settings_cls)

    def public(self) -> dict[str, Any]:
        """The settings as JSON-able values, secrets masked: what start-up prints."""
        shown = self.model_dump(mode="json")
        for name, value in self:
            if isinstance(value, SecretStr):
                shown[name] = "**********"
        return shown


def _known() -> str:
    return ", ".join(sorted(Settings.model_fields))


class _StrictEnvSource(EnvSettingsSource):
    """The environment, where a ZARR_GATEWAY_* variable that names no setting is an error, not ignored."""

    def __call__(self) -> dict[str, Any]:
        unknown = sorted(
            name
            for name in os.environ
            if name.upper().startswith(ENV_PREFIX) and name[len(ENV_PREFIX) :].lower() not in Settings.model_fields
        )
        if unknown:
            raise SettingsError(f"unknown setting in the environment: {', '.join(unknown)} (known: {_known()})")
        return super().__call__()


class _SettingsFileSource(PydanticBaseSettingsSource):
    """The settings file named by a flag or by ZARR_GATEWAY_SETTINGS_FILE (already in current_state)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get("settings_file")
        if not path:
            return {}
        return read_settings_file(Path(path))


def read_settings_file(path: Path) -> dict[str, Any]:
    """Settings from a JSON object or ``KEY=VALUE`` lines; keys are setting names, with or without the prefix."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"settings file {str(path)!r} cannot be read: {exc.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise SettingsError(f"settings file {str(path)!r} is not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise SettingsError(f"settings file {str(path)!r} must hold a JSON object of settings")
        items = list(document.items())
    else:
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, equals, value = line.removeprefix("export ").partition("=")
            if not equals:
                raise SettingsError(f"settings file {str(path)!r} line {number}: expected KEY=VALUE")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            if not value:
                continue  # KEY= leaves the setting to its default, as an empty variable does
            items.append((key.strip(), value))
    values: dict[str, Any] = {}
    unknown = []
    for key, value in items:
        name = key.lower().removeprefix(ENV_PREFIX.lower())
        if name not in Settings.model_fields or name == "settings_file":
            unknown.append(key)
        else:
            values[name] = value
    if unknown:
        raise SettingsError(f"unknown setting in settings file {str(path)!r}: {', '.join(unknown)} (known: {_known()})")
    return values
