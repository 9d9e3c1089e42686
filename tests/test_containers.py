"""The compose stack as real containers: deploy/Dockerfile built and deploy/docker-compose.yml run by Docker.

A Docker engine of its own (Debian's dockerd, with its data root, exec root and socket in a temporary
directory) runs for this module, so nothing of the host's Docker changes. It adds no iptables rules and
no default bridge: compose networks are plain bridges in an address pool of their own, published ports go
through Docker's userland proxy, and builds use the host's network (the engine does no NAT). Public
images cannot be pulled here, so scripts/docker-stand-ins makes local stand-ins under the names the files
use. Then the image is built from deploy/Dockerfile, the stack is started with Debian's docker-compose
and the settings of deploy/.env.example, and real clients read through the published port.
"""

import contextlib
import html
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from support.datasets import LAYERS, ORG, OTHER_TOKEN, TOKEN, WrittenDataset, mag_name
from support.mesh_reads import read_a_mesh_fragment
from support.processes import free_port, stop_process

from deploy.render import AUTH_SCOPE, TEMPLATES
from gateway.sample import DATASET as SAMPLE_DATASET
from gateway.sample import ORGANIZATION as SAMPLE_ORG

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DATASET = "wk_dataset"
HEADERS = {"X-Auth-Token": TOKEN}
# How the nginx image's entrypoint begins the notes it writes on stdout (NGINX_ENTRYPOINT_QUIET_LOGS silences them).
ENTRYPOINT_NOTE = "/docker-entrypoint.sh: "
# Measured on 2 cores: stand-ins 1-5 min, the image build 1-4.5 min, the stack under 1 min (the range: other load).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]


def _tool(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if Path(p).exists()), None)
    if path is None:
        pytest.fail(f"{name} is missing: run scripts/install-system-packages as root (scripts/test does)")
    return path


def _report_time(step: str, started: float) -> None:
    """How long a step that may be slow took, on stderr (``pytest -s`` shows it): the budget is a few minutes."""
    if time.monotonic() - started >= 2:
        print(f"[{time.monotonic() - started:6.1f} s] {step}", file=sys.stderr)


def _run(command: list[str], env: dict[str, str], timeout: float = 600, check: bool = True) -> str:
    """Run a command in a session of its own, so that a timeout stops what it started too (debootstrap, apt)."""
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    _report_time(f"{Path(command[0]).name} {' '.join(command[1:3])}", started)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


# --- a Docker engine of the test's own ---------------------------------------------------------------------


def _unused_address_pool() -> str:
    """A 10.x.0.0/16 that no route of this host uses, for the engine's networks (another engine may run too)."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    used = {int(m) for m in re.findall(r"^10\.(\d+)\.", routes, re.MULTILINE)}
    free = [n for n in range(64, 250) if n not in used]
    return f"10.{random.choice(free)}.0.0/16"


def _mounts_under(directory: Path) -> list[str]:
    mount_points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((m for m in mount_points if m.startswith(f"{directory}/")), key=len, reverse=True)


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return children + [d for c in children for d in _descendants(c)]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Engine:
    directory: Path
    process: subprocess.Popen[bytes]
    env: dict[str, str]  # for docker and docker-compose: this engine, a config directory of its own
    helpers: list[int] = field(default_factory=list)  # containerd and shims started by dockerd

    def docker(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        return _run([_tool("docker"), *args], self.env, timeout, check)

    def log(self) -> str:
        return (self.directory / "dockerd.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop dockerd (it stops its containerd), then anything left; unmount and remove the directory."""
        started = time.monotonic()
        self.helpers = sorted(set(self.helpers) | set(_descendants(self.process.pid)))
        stop_process(self.process, 60)
        for pid in self.helpers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mount_point in _mounts_under(self.directory):
            subprocess.run(["umount", "-l", mount_point], capture_output=True)
        shutil.rmtree(self.directory, ignore_errors=True)
        _report_time("dockerd stopped, its directory removed", started)


def start_engine() -> Engine:
    if os.geteuid() != 0:
        pytest.fail("the container tests run Docker's engine and debootstrap, which need root")
    directory = Path(tempfile.mkdtemp(prefix="zg-docker-", dir="/tmp"))  # short: the socket path is bounded
    name = f"zg-docker-{uuid.uuid4().hex[:8]}"  # a containerd namespace: mkdtemp's "_" or "-" runs are refused
    socket_path = directory / "docker.sock"
    command = [
        _tool("dockerd"),
        f"--data-root={directory / 'data'}",
        f"--exec-root={directory / 'exec'}",
        f"--pidfile={directory / 'dockerd.pid'}",
        f"--host=unix://{socket_path}",
        f"--containerd-namespace={name}",
        f"--containerd-plugins-namespace={name}-plugins",
        # Leave the host's firewall and forwarding alone: another engine may run on this host too.
        "--iptables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--bridge=none",
        f"--default-address-pool=base={_unused_address_pool()},size=24",
    ]
    (directory / "config").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    env.update(DOCKER_HOST=f"unix://{socket_path}", DOCKER_CONFIG=str(directory / "config"))
    started = time.monotonic()
    with open(directory / "dockerd.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(directory, process, env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            engine.stop()
            pytest.fail(f"dockerd exited:\n{engine.log()}")
        if socket_path.exists() and engine.docker("version", check=False, timeout=20):
            engine.helpers = _descendants(process.pid)
            _report_time("dockerd started", started)
            return engine
        time.sleep(0.5)
    log_text = engine.log()
    engine.stop()
    pytest.fail(f"dockerd did not answer within 60 s:\n{log_text}")


# --- building -----------------------------------------------------------------------------------------------


def default_python_image() -> str:
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "deploy/Dockerfile names its base image in ARG PYTHON_IMAGE"
    return match.group(1)


def pip_build_args() -> list[str]:
    """The package indexes this host's pip uses, and its proxies, for pip inside the build.

    Only http(s) indexes: a file:// index of the host is not inside the build.
    """
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    urls: dict[str, list[str]] = {"index-url": [], "extra-index-url": []}
    for key, value in re.findall(r"^\S*\.((?:extra-)?index-url)='(.*)'$", listing, re.MULTILINE):
        urls[key] += [url for url in value.split() if url.startswith(("http://", "https://"))]
    args = []
    if urls["index-url"]:
        args += ["--build-arg", f"PIP_INDEX_URL={urls['index-url'][-1]}"]
    if urls["extra-index-url"]:
        args += ["--build-arg", f"PIP_EXTRA_INDEX_URL={' '.join(urls['extra-index-url'])}"]
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        if os.environ.get(name):
            args += ["--build-arg", name]  # docker takes the value from its environment
    return args


# --- the stack ----------------------------------------------------------------------------------------------


def env_example() -> dict[str, str]:
    lines = (DEPLOY / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#") and "=" in line)


@dataclass
class Stack:
    engine: Engine
    project: str
    env_file: Path
    url: str
    tokens_dir: Path
    override: Path  # the test's compose override: shorter health-check intervals (write_health_override)

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        # Debian's docker-compose 1.29 applies deploy.replicas only in compatibility mode.
        command = [_tool("docker-compose"), "--compatibility", "--project-name", self.project]
        command += ["--env-file", str(self.env_file), "--file", str(COMPOSE_FILE), "--file", str(self.override)]
        return _run([*command, *args], self.engine.env, timeout, check)

    def containers(self, service: str | None = None, all_states: bool = False) -> list[str]:
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        listed = self.engine.docker("ps", "--quiet", "--no-trunc", *(["--all"] if all_states else []), *filters)
        return listed.split()

    def inspect(self, container: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.engine.docker("inspect", container))[0]
        return found

    def logs(self, container: str, stream: str = "both") -> list[str]:
        """A container's log lines: stdout, stderr or both (docker logs writes each to the same stream)."""
        result = subprocess.run(
            [_tool("docker"), "logs", container], env=self.engine.env, capture_output=True, text=True, timeout=60
        )
        text = {"stdout": result.stdout, "stderr": result.stderr, "both": result.stdout + result.stderr}[stream]
        return [line for line in text.splitlines() if line.strip()]

    def proxy_access_log(self) -> list[dict[str, Any]]:
        """The proxy's access log: every line on its stdout but the entrypoint's start-up notes, as JSON."""
        (proxy,) = self.containers("proxy")
        return [json.loads(line) for line in self.logs(proxy, "stdout") if not line.startswith(ENTRYPOINT_NOTE)]

    def wait_healthy(self, count: int, timeout: float = 240) -> None:
        started = time.monotonic()
        deadline = started + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            containers = self.containers()
            states = {c[:12]: self.inspect(c)["State"].get("Health", {}).get("Status", "none") for c in containers}
            if len(states) == count and all(s == "healthy" for s in states.values()):
                _report_time(f"{count} containers healthy", started)
                return
            if any(s == "unhealthy" for s in states.values()):
                break
            time.sleep(1)
        tails = {c[:12]: "\n".join(self.logs(c)[-20:]) for c in self.containers(all_states=True)}
        details = "\n".join(f"{c}:\n{tail}" for c, tail in tails.items())
        raise AssertionError(f"not {count} healthy containers: {states}\n{details}")


# Docker probes a container first one interval after it starts, then every interval: with the file's 15 s, the
# stack turns healthy half a minute after `up` (the proxy waits for a healthy gateway), a scaled replica 15 s
# after it starts. The test's override probes with the same commands every 2 s, and gives a container as long as
# the file does before its failures count (start period plus retries times the interval); the rest is the file's.
HEALTH_INTERVAL_SECONDS = 2


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"a compose duration in whole seconds: {duration!r}"
    return int(match.group(1))


def write_health_override(directory: Path) -> Path:
    """A compose file that merges into deploy/docker-compose.yml: each service's health check more often."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    checks = {name: service["healthcheck"] for name, service in services.items() if "healthcheck" in service}
    assert set(checks) == {"gateway", "proxy"}, "every service of the stack has a health check"
    override = {}
    for name, check in checks.items():
        grace = _seconds(check.get("start_period", "0s")) + check["retries"] * _seconds(check["interval"])
        override[name] = {"healthcheck": {"interval": f"{HEALTH_INTERVAL_SECONDS}s", "start_period": f"{grace}s"}}
    path = directory / "docker-compose.health.yml"
    path.write_text(yaml.safe_dump({"services": override}))
    return path


def make_data_root(test_data: WrittenDataset, directory: Path) -> Path:
    """The test dataset, readable by the gateways' user (pytest's own directories are private to root)."""
    root = directory / "data"
    shutil.copytree(test_data.root / ORG / DATASET, root / ORG / DATASET)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def make_sample_in_image(engine: "Engine", image: str, root: Path) -> Path:
    """``docker run IMAGE make-sample /data``, as a lab tries the image first: the sample beside the test data."""
    uid, gid = int(env_example()["GATEWAY_UID"]), int(env_example()["GATEWAY_GID"])
    os.chown(root, uid, gid)
    engine.docker("run", "--rm", "--network", "none", "--volume", f"{root}:/data", image, "make-sample", "/data")
    return root


def make_tokens_dir(directory: Path, tokens: dict[str, list[str]]) -> Path:
    """As the README's Deploy section says: a private directory owned by the gateways' user."""
    secrets = directory / "secrets"
    secrets.mkdir()
    write_tokens(secrets, tokens)
    secrets.chmod(0o700)
    uid, gid = int(env_example()["GATEWAY_UID"]), int(env_example()["GATEWAY_GID"])
    for path in (secrets, secrets / "tokens.json"):
        os.chown(path, uid, gid)
    return secrets


def write_tokens(secrets: Path, tokens: dict[str, list[str]]) -> None:
    """Replace tokens.json as an editor does: a new file renamed over the old one."""
    staged = secrets / "tokens.json.new"
    staged.write_text(json.dumps({"tokens": tokens}))
    staged.chmod(0o600)
    if (secrets / "tokens.json").exists():
        stat = (secrets / "tokens.json").stat()
        os.chown(staged, stat.st_uid, stat.st_gid)
    staged.replace(secrets / "tokens.json")


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    for name in ("dockerd", "docker", "docker-compose", "debootstrap"):
        _tool(name)
    started = start_engine()
    try:
        yield started
    finally:
        started.stop()
    assert not _mounts_under(started.directory), "mounts left behind"
    assert not started.directory.exists(), "engine directory left behind"
    assert not [pid for pid in started.helpers if _alive(pid)], "processes of the engine left running"


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, str]:
    """The stand-ins under the names the files use, then the gateway image built from deploy/Dockerfile."""
    names = {"python": default_python_image(), "proxy": env_example()["PROXY_IMAGE"]}
    names["gateway"] = env_example()["GATEWAY_IMAGE"]
    _run([str(REPO / "scripts" / "docker-stand-ins"), names["python"], names["proxy"]], engine.env, timeout=900)
    build = [_tool("docker"), "build", "--network", "host", *pip_build_args()]
    build += ["--file", str(DOCKERFILE), "--tag", names["gateway"], str(REPO)]
    # The classic builder, as docker-compose 1.29 builds (a Dockerfile must not need BuildKit).
    _run(build, {**engine.env, "DOCKER_BUILDKIT": "0"}, timeout=1200)
    return names


@pytest.fixture(scope="module")
def stack(engine: Engine, images: dict[str, str], test_data: WrittenDataset) -> Iterator[Stack]:
    directory = engine.directory / "deployment"
    directory.mkdir()
    settings = env_example()
    settings.update(
        COMPOSE_PROJECT_NAME=f"zg{uuid.uuid4().hex[:10]}",
        DATA_ROOT=str(make_sample_in_image(engine, images["gateway"], make_data_root(test_data, directory))),
        TOKENS_DIR=str(
            make_tokens_dir(directory, {TOKEN: [f"{ORG}/*", f"{SAMPLE_ORG}/*"], OTHER_TOKEN: ["other_org/*"]})
        ),
        PUBLIC_PORT=f"127.0.0.1:{free_port()}",
    )
    env_file = directory / "deploy.env"
    env_file.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    port = settings["PUBLIC_PORT"].rsplit(":", 1)[1]
    deployed = Stack(
        engine,
        settings["COMPOSE_PROJECT_NAME"],
        env_file,
        f"http://127.0.0.1:{port}",
        Path(settings["TOKENS_DIR"]),
        write_health_override(directory),
    )
    try:
        deployed.compose("up", "--detach", "--no-build")
        deployed.wait_healthy(int(settings["GATEWAY_REPLICAS"]) + 1)
        yield deployed
    finally:
        deployed.compose("down", "--volumes", "--timeout", "20", check=False)


# --- the tests, in order: the last one takes the stack down -----------------------------------------------------


def test_the_dockerfile_needs_no_registry_frontend() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE), "BuildKit would fetch a frontend"
    assert not re.search(r"^ARG PIP_(EXTRA_)?INDEX_URL=", text, re.MULTILINE), "no host's index baked in"


def test_two_gateway_replicas_and_the_proxy_turn_healthy(stack: Stack) -> None:
    gateways = stack.containers("gateway")
    assert len(gateways) == int(env_example()["GATEWAY_REPLICAS"]) == 2
    for container in gateways:
        details = stack.inspect(container)
        assert details["State"]["Health"]["Status"] == "healthy"
        assert details["HostConfig"]["ReadonlyRootfs"] is True
        assert stack.engine.docker("exec", container, "id", "-u").strip() == "10001"
    (proxy,) = stack.containers("proxy")
    assert stack.inspect(proxy)["State"]["Health"]["Status"] == "healthy"
    # only the proxy publishes a port, on loopback
    published = stack.inspect(proxy)["NetworkSettings"]["Ports"]["8080/tcp"]
    assert [(p["HostIp"], p["HostPort"]) for p in published] == [("127.0.0.1", stack.url.rsplit(":", 1)[1])]
    assert all(not stack.inspect(c)["NetworkSettings"]["Ports"].get("8000/tcp") for c in gateways)


def test_the_proxy_renders_its_template_and_has_njs(stack: Stack) -> None:
    (proxy,) = stack.containers("proxy")
    rendered = stack.engine.docker("exec", proxy, "cat", "/etc/nginx/conf.d/default.conf")
    assert "server gateway:8000;" in rendered and "listen 8080;" in rendered
    assert not re.search(r"\$\{?PROXY_[A-Z0-9]", rendered), "every PROXY_ name is substituted"
    assert "$request_uri" in rendered, "nginx's own variables are left alone"
    rendered_files = stack.engine.docker("exec", proxy, "find", "/etc/nginx/conf.d", "-type", "f").split()
    assert sorted(path.removeprefix("/etc/nginx/conf.d/") for path in rendered_files) == sorted(TEMPLATES)
    scope = stack.engine.docker("exec", proxy, "cat", "/etc/nginx/conf.d/auth-scope.conf")
    assert scope == AUTH_SCOPE.read_text(), "the file the Ingress controller shares is used as it is"
    # njs, as in the official image: a main-context configuration can load it by the same relative path
    njs_config = "load_module modules/ngx_http_js_module.so; events {} http { js_var $zg_njs_probe 1; }"
    check = f"printf '%s' '{njs_config}' > /tmp/njs.conf && nginx -t -c /tmp/njs.conf 2>&1"
    assert "test is successful" in stack.engine.docker("exec", proxy, "sh", "-c", check)


def test_tokens_are_enforced(stack: Stack) -> None:
    dataset = f"{stack.url}/data/zarr/{ORG}/{DATASET}/datasource-properties.json"
    assert requests.get(dataset, timeout=10).status_code == 401
    assert requests.get(dataset, headers={"X-Auth-Token": "not-a-token"}, timeout=10).status_code == 401
    assert requests.get(dataset, headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10).status_code == 403
    answer = requests.get(dataset, headers=HEADERS, timeout=10)
    assert answer.status_code == 200, answer.text
    assert {layer["name"] for layer in answer.json()["dataLayers"]} == {name for name, *_ in LAYERS}
    assert requests.get(dataset, params={"token": TOKEN}, timeout=10).status_code == 200
    for internal in ("/metrics", "/readyz", "/auth"):
        assert requests.get(stack.url + internal, headers=HEADERS, timeout=10).status_code == 404


def test_zarr_python_reads_voxel_exact_through_the_published_port(stack: Stack, test_data: WrittenDataset) -> None:
    import zarr

    for layer, mag in (("color_u8", (1, 1, 1)), ("segmentation", (2, 2, 1))):
        url = f"{stack.url}/data/zarr/{ORG}/{DATASET}/{layer}/{mag_name(mag)}"
        array = zarr.open_array(url, mode="r", storage_options={"headers": HEADERS})
        np.testing.assert_array_equal(array[...], test_data.expected(layer, mag))


def test_tensorstore_reads_voxel_exact_through_the_published_port(stack: Stack, test_data: WrittenDataset) -> None:
    import tensorstore as ts

    for layer, mag in (("rgb", (1, 1, 1)), ("color_u16", (4, 4, 2))):
        base_url = f"{stack.url}/data/zarr3/{ORG}/{DATASET}/{layer}/{mag_name(mag)}/"
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "http", "base_url": base_url, "headers": [f"X-Auth-Token: {TOKEN}"]},
        }
        array = ts.open(spec, read=True).result()
        np.testing.assert_array_equal(array.read().result(), test_data.expected(layer, mag))


def test_logs_are_json_lines_without_tokens(stack: Stack) -> None:
    request_id = f"containers-{uuid.uuid4().hex}"
    path = f"/data/zarr/{ORG}/{DATASET}/color_u8/1/.zarray"
    # a query beside the token keeps the proxy's answer cache out of it: the request reaches a gateway
    url = f"{stack.url}{path}?n={request_id}"
    answer = requests.get(url, headers={**HEADERS, "X-Request-Id": request_id}, timeout=10)
    assert answer.status_code == 200 and answer.headers["X-Request-Id"] == request_id
    (proxy,) = stack.containers("proxy")
    notes = [line for line in stack.logs(proxy, "stdout") if line.startswith(ENTRYPOINT_NOTE)]
    quiet = any(e.startswith("NGINX_ENTRYPOINT_QUIET_LOGS=") for e in stack.inspect(proxy)["Config"]["Env"])
    assert bool(notes) != quiet, "the image's entrypoint notes its steps unless NGINX_ENTRYPOINT_QUIET_LOGS is set"
    proxy_lines = stack.proxy_access_log()
    assert any(line["request_id"] == request_id and line["path"] == path for line in proxy_lines)
    gateway_records: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15  # the gateways write their access logs in batches
    while time.monotonic() < deadline and not any(r.get("request_id") == request_id for r in gateway_records):
        gateway_records = [
            json.loads(line) for c in stack.containers("gateway") for line in stack.logs(c) if line.startswith("{")
        ]
        time.sleep(0.5)
    for container in stack.containers("gateway"):
        lines = stack.logs(container)
        assert lines, "a gateway logs at least its start"
        for line in lines:
            try:
                assert isinstance(json.loads(line), dict)
            except json.JSONDecodeError:
                pytest.fail(f"not a JSON line in {container[:12]}'s log: {line!r}")
    assert any(r.get("request_id") == request_id and r.get("path") == path for r in gateway_records)
    every_line = "\n".join(line for c in stack.containers() for line in stack.logs(c))
    assert TOKEN not in every_line and OTHER_TOKEN not in every_line


def test_the_image_serves_the_sample_it_made_with_meshes_through_the_proxy(stack: Stack) -> None:
    """The image installs every feature: the sample made by ``docker run IMAGE make-sample`` has its segment
    index, a mesh fragment reads through the proxy, and no gateway logs a feature as off."""
    assert read_a_mesh_fragment(stack.url, f"{SAMPLE_ORG}/{SAMPLE_DATASET}", "segmentation", **HEADERS)
    for container in stack.containers("gateway"):
        off = [line for line in stack.logs(container) if "feature off" in line]
        assert off == [], off


def test_the_image_serves_its_own_viewer_through_the_proxy(stack: Stack) -> None:
    """The image's Neuroglancer client (the viewer extra) loads through the compose proxy without a token,
    and the dataset page links to it, not to an https viewer that could not read this http stack."""
    page = requests.get(f"{stack.url}/neuroglancer/v/gateway/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:300]
    scripts = [name for name in page.text.split('"') if name.startswith("main.") and name.endswith(".js")]
    assert scripts, page.text[:500]
    client = requests.get(f"{stack.url}/neuroglancer/v/gateway/{scripts[0]}", timeout=30)
    assert client.status_code == 200 and len(client.content) > 100_000
    dataset = requests.get(f"{stack.url}/data/zarr3/{SAMPLE_ORG}/{SAMPLE_DATASET}/?token={TOKEN}", timeout=30)
    assert dataset.status_code == 200
    links = re.findall(r'class="open-neuroglancer" href = "([^"]+)"', dataset.text)
    assert links and all(f"/t/{TOKEN}/neuroglancer/v/gateway/#!" in html.unescape(link) for link in links), links


def test_a_replaced_tokens_file_is_seen_without_a_restart(stack: Stack) -> None:
    new_token = f"rotated-{uuid.uuid4().hex}"
    url = f"{stack.url}/data/zarr/{ORG}/{DATASET}/.zgroup"
    assert requests.get(url, headers={"X-Auth-Token": new_token}, timeout=10).status_code == 401
    write_tokens(stack.tokens_dir, {new_token: [f"{ORG}/*"], OTHER_TOKEN: ["other_org/*"]})
    reload_seconds = float(env_example()["ZARR_GATEWAY_TOKENS_RELOAD_SECONDS"])
    deadline = time.monotonic() + 5 * reload_seconds + 10
    statuses: list[tuple[int, int]] = []
    while time.monotonic() < deadline:
        # both replicas must see it: several requests in a row all succeed with the new token, none with the old
        statuses = [
            (
                requests.get(url, headers={"X-Auth-Token": new_token}, timeout=10).status_code,
                requests.get(url, headers=HEADERS, timeout=10).status_code,
            )
            for _ in range(8)
        ]
        if all(s == (200, 401) for s in statuses):
            break
        time.sleep(0.5)
    assert all(s == (200, 401) for s in statuses), statuses
    write_tokens(stack.tokens_dir, {TOKEN: [f"{ORG}/*", f"{SAMPLE_ORG}/*"], OTHER_TOKEN: ["other_org/*"]})


def test_scaling_up_and_reloading_the_proxy_spreads_requests_over_every_replica(stack: Stack) -> None:
    """The README's "Scale replicas" commands."""
    stack.compose("up", "--detach", "--no-build", "--scale", "gateway=3")
    stack.wait_healthy(4)
    stack.compose("exec", "-T", "proxy", "nginx", "-s", "reload")
    replicas = {
        stack.inspect(c)["NetworkSettings"]["Networks"][f"{stack.project}_default"]["IPAddress"]
        for c in stack.containers("gateway")
    }
    assert len(replicas) == 3
    deadline = time.monotonic() + 60
    seen: set[str] = set()
    marker = f"scale-{uuid.uuid4().hex}"
    while time.monotonic() < deadline and seen != replicas:
        for i in range(30):
            headers = {**HEADERS, "X-Request-Id": f"{marker}-{i}"}
            # a query beside the token: never answered from the proxy's answer cache, so each reaches a replica
            url = f"{stack.url}/data/zarr/{ORG}/{DATASET}/.zattrs?n={i}"
            response = requests.get(url, headers=headers, timeout=10)
            assert response.status_code == 200
        lines = stack.proxy_access_log()
        seen = {line["upstream_addr"].rsplit(":", 1)[0] for line in lines if line["request_id"].startswith(marker)}
    assert seen == replicas


def test_down_leaves_no_container_network_or_volume(stack: Stack) -> None:
    label = f"label=com.docker.compose.project={stack.project}"
    assert stack.containers(all_states=True)
    assert stack.engine.docker("network", "ls", "--quiet", "--filter", label).split()
    stack.compose("down", "--volumes", "--timeout", "20")
    assert stack.containers(all_states=True) == []
    assert stack.engine.docker("network", "ls", "--quiet", "--filter", label).split() == []
    assert stack.engine.docker("volume", "ls", "--quiet").split() == []
    with pytest.raises(requests.ConnectionError):
        requests.get(stack.url + "/healthz", timeout=5)
