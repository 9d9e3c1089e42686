"""All settings in one model: environment variables (ZARR_GATEWAY_*), then CLI flags on top."""

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .zarr.codecs import Codec

ALLOWED_CHUNK_EDGES = (32, 64, 128, 256)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ZARR_GATEWAY_", extra="forbid")

    root: Path = Field(description="data root: <root>/<organization>/<dataset>/datasource-properties.json")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    tokens_file: Path | None = Field(default=None, description="JSON tokens file; without it the gateway is open")
    workers: int = Field(default=1, ge=1)
    codec: Codec = Field(default=Codec.BLOSC_LZ4, description="codec of chunks that are not passed through")
    chunk_edge: int = Field(default=32, description="edge of served chunks in voxels")
    v3_layout: Literal["plain", "sharded"] = Field(default="plain", description="v3 arrays: plain chunks or shards")
    cache_bytes: int = Field(default=256 << 20, ge=0, description="bound of the header/jump-table/shard cache")
    cache_control: str = Field(default="no-cache", description="Cache-Control of every data response")
    threads: int = Field(default_factory=lambda: max(4, 2 * (os.cpu_count() or 1)), ge=1)

    @field_validator("chunk_edge")
    @classmethod
    def _chunk_edge(cls, edge: int) -> int:
        if edge not in ALLOWED_CHUNK_EDGES:
            raise ValueError(f"chunk_edge must be one of {', '.join(map(str, ALLOWED_CHUNK_EDGES))}, got {edge}")
        return edge

    @field_validator("root")
    @classmethod
    def _root_exists(cls, root: Path) -> Path:
        if not root.is_dir():
            raise ValueError(f"data root {str(root)!r} is not a directory")
        return root
