"""nginx twice: serving the gateway's bytes as static files (the ceiling), and as the deployment's proxy.

The proxy is deploy/nginx.conf rendered as docker-compose.yml's defaults render it (deploy/render.py,
the same rendering the deployment tests run), in front of a gateway on loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from deploy.render import compose_defaults, write_proxy_config

from .processes import Server, clean_env, free_port

# One load generator is one client address: the per-client rate and connection limits of the
# deployment would answer most of its requests with 429. Everything else stays as deployed.
PROXY_UNLIMITED = {"PROXY_RATE_LIMIT": "1000000r/s", "PROXY_RATE_BURST": "1000000", "PROXY_CONN_LIMIT": "4096"}


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def _required_nginx() -> str:
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (scripts/install-system-packages installs it)")
    return binary


def start_nginx(static: Path, work: Path, logs: Path) -> Server:
    """nginx serving ``static`` as files, tuned as a static server would be (the ceiling)."""
    binary = _required_nginx()
    port = free_port()
    prefix = work / f"nginx-{port}"
    for sub in ("tmp", "logs"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    user = ""
    if os.geteuid() == 0:  # workers would run as nobody and could not enter a private (0700) tree
        import grp
        import pwd

        user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
    conf = f"""
{user}
worker_processes 2;
daemon off;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
    default_type application/octet-stream;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {static};
        location / {{ }}
    }}
}}
"""
    (prefix / "nginx.conf").write_text(conf)
    args = [binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", "stderr"]
    return Server("nginx", args, port, logs / f"nginx-{port}.log", clean_env())


def start_proxy(upstream_port: int, logs: Path, tls: tuple[int, Path] | None = None) -> Server:
    """The deployment's proxy as the compose file's defaults render it, in front of the gateway on ``upstream_port``.

    ``tls``: also its TLS and HTTP/2 listener, on that port with ``tls.crt`` and ``tls.key`` of that directory.
    Its configuration, temporary files and caches are in a directory of its own that nginx's workers can
    enter (they run as another user when nginx starts as root, and the work tree may be private), removed
    when it stops. So every proxy starts with empty caches; any other ``proxy_cache_path`` of the
    rendered configuration is emptied first.
    """
    binary = _required_nginx()
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix=f"bench-proxy-{port}-"))
    directory.chmod(0o755)
    values = compose_defaults()
    values.pop("NGINX_ENVSUBST_FILTER")
    values.update(
        PROXY_LISTEN=f"127.0.0.1:{port}",
        PROXY_UPSTREAM_SERVERS=f"server 127.0.0.1:{upstream_port};",
        PROXY_ANSWER_CACHE_DIR=str(directory / "answer-cache"),  # each proxy's own, empty: cold means cold
        **PROXY_UNLIMITED,
    )
    for name in [n for n in values if n.endswith(("_CACHE_DIR", "_CACHE_PATH"))]:
        values[name] = str(directory / "cache" / name.lower())
    (directory / "cache").mkdir()  # nginx makes only the last part of a cache's path
    if tls is not None:
        values.update(PROXY_TLS="on", PROXY_TLS_LISTEN=f"127.0.0.1:{tls[0]}", PROXY_TLS_DIR=str(tls[1]))
    unset = write_proxy_config(directory, values)
    if unset:
        raise RuntimeError(f"{unset}: names of deploy/'s templates that docker-compose.yml does not set")
    for conf in (directory / "conf.d").rglob("*.conf"):
        for cache in re.findall(r"^\s*proxy_cache_path\s+(\S+)", conf.read_text(), re.MULTILINE):
            shutil.rmtree(cache, ignore_errors=True)
    args = [binary, "-c", str(directory / "nginx.conf"), "-p", str(directory)]
    return Server("proxy", args, port, logs / f"proxy-{port}.log", clean_env(), scratch=directory)
