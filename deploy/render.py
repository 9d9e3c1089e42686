"""The proxy's templates (nginx.conf, auth-scope.conf) rendered as the nginx image renders them.

The values are docker-compose.yml's. The tests run the rendered proxy in front of gateways, and the
benchmark measures it; both render it here, the one way the image does.
"""

import os
import re
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parent
TEMPLATE = DEPLOY / "nginx.conf"
AUTH_SCOPE = DEPLOY / "auth-scope.conf"
TLS = DEPLOY / "tls.conf"  # the optional TLS listener, included by the server block when PROXY_TLS is on
# The templates docker-compose.yml mounts into the nginx image, by the name each is rendered to in conf.d.
TEMPLATES = {"default.conf": TEMPLATE, "auth-scope.conf": AUTH_SCOPE, "tls/on.conf": TLS}
COMPOSE = DEPLOY / "docker-compose.yml"

# What the nginx image's /etc/nginx/nginx.conf does, with paths in a directory of one's own ({dir}).
WRAPPER = """# What the nginx image's /etc/nginx/nginx.conf does, with paths in a temporary directory.
{user}
daemon off;
worker_processes 2;
pid {dir}/nginx.pid;
error_log {dir}/main-error.log notice;
events {{ worker_connections 1024; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 65;
    client_body_temp_path {dir}/temp/body;
    proxy_temp_path {dir}/temp/proxy;
    fastcgi_temp_path {dir}/temp/fastcgi;
    uwsgi_temp_path {dir}/temp/uwsgi;
    scgi_temp_path {dir}/temp/scgi;
    include {dir}/conf.d/*.conf;
}}
"""


def _worker_user() -> str:
    """The image's workers run as its own user; run as root here, they would drop to nobody, who cannot enter
    the private temporary directory that holds the answer cache: then they stay root."""
    return "user root;" if os.geteuid() == 0 else ""


def render(template: str, values: dict[str, str]) -> str:
    """envsubst restricted to ``values`` (the image passes the defined ^PROXY_ variables): ${NAME} and $NAME."""
    names = "|".join(map(re.escape, sorted(values, key=len, reverse=True)))
    pattern = re.compile(r"\$\{(" + names + r")\}|\$(" + names + r")(?![A-Za-z0-9_])")
    return pattern.sub(lambda m: values[m.group(1) or m.group(2)], template)


def compose() -> dict[str, Any]:
    import yaml

    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def compose_defaults() -> dict[str, str]:
    """The proxy's environment as docker-compose.yml sets it without a .env: ${NAME:-default} -> default."""
    values = {}
    for name, value in compose()["services"]["proxy"]["environment"].items():
        match = re.fullmatch(r"\$\{(\w+):-(.*)\}", str(value))
        values[name] = match.group(2) if match else str(value)
    return values


def unset_names(rendered: str) -> list[str]:
    """Template names left in a rendered file: names docker-compose.yml does not set."""
    return re.findall(r"\$\{?PROXY_[A-Z0-9_]+", rendered)


def write_proxy_config(directory: Path, values: dict[str, str]) -> list[str]:
    """Every template rendered into ``directory/conf.d`` and the image's wrapper as ``directory/nginx.conf``.

    Returns the template names left unset (names docker-compose.yml does not set); ``conf.d`` and
    ``temp`` are made if missing.
    """
    (directory / "conf.d").mkdir(parents=True, exist_ok=True)
    (directory / "temp").mkdir(exist_ok=True)
    unset: list[str] = []
    for name, template in TEMPLATES.items():
        rendered = render(template.read_text(), values)
        unset += unset_names(rendered)
        (directory / "conf.d" / name).parent.mkdir(exist_ok=True)
        (directory / "conf.d" / name).write_text(rendered)
    (directory / "nginx.conf").write_text(WRAPPER.format(dir=directory, user=_worker_user()))
    return unset
