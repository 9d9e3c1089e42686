"""The Kubernetes deployment (deploy/kubernetes), checked without a cluster.

Every overlay is rendered by kubectl's built-in kustomize; every rendered object is validated against the
schemas of current Kubernetes versions (kubernetes-validate); checkov scans the manifests, the Dockerfile
and the deploy directory; the invariants the README promises are checked on the rendered YAML; and the
real gateway is started with the environment, files and mounts a pod would get from the rendered objects.
"""

import base64
import html
import http.client
import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import requests
import yaml
from support.datasets import ORG, OTHER_TOKEN, REPEATED_TOKENS, TOKEN, WrittenDataset
from support.kubectl import kubectl
from support.processes import free_port, raw_exchange, stop_process, wait_until

from deploy.render import AUTH_SCOPE  # the controller's http-snippet (README, Kubernetes)
from gateway.settings import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parent.parent
KUBERNETES = REPO / "deploy" / "kubernetes"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
OVERLAYS = ("object-storage", "shared-filesystem")
# Schemas: the oldest version the README names (its preStop sleep action is on by default from 1.30) and
# the newest one kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Routes for the cluster's insiders only: probes, scraping, the ingress controller's token check.
INTERNAL_ROUTES = ("/metrics", "/healthz", "/readyz", "/auth")
TOKENS = {"tokens": {TOKEN: [f"{ORG}/*"], OTHER_TOKEN: ["other_org/*"]}}
S3_CREDENTIALS = "AWS_ACCESS_KEY_ID=k8s-test-key\nAWS_SECRET_ACCESS_KEY=k8s-test-secret\n"
# Custom resources have no schema in kubernetes-validate; test_the_service_monitor_scrapes_the_service checks it.
CUSTOM_KINDS = {"ServiceMonitor"}


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)


def render(directory: Path) -> list[dict[str, Any]]:
    built = kustomize(directory)
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes with the files an operator adds (tokens, S3 keys) in each overlay."""
    copy = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(KUBERNETES, copy, ignore=shutil.ignore_patterns("tokens.json", "s3-credentials.env"))
    for overlay in OVERLAYS:
        (copy / "overlays" / overlay / "tokens.json").write_text(json.dumps(TOKENS))
    (copy / "overlays" / "object-storage" / "s3-credentials.env").write_text(S3_CREDENTIALS)
    return copy


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(tree / "overlays" / overlay) for overlay in OVERLAYS}


def the(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


CHECKED_INGRESS = "zarr-gateway"  # every path that reads data, each request checked by the gateways' /auth
OPEN_INGRESS = "zarr-gateway-open"  # sign-in, the viewer's own files and the favicon: they read no data
# What a browser's sign-in needs, and what the open Ingress must route (the gateway answers it, not the default).
OPEN_ROUTES = ("/login", "/callback", "/logout", "/neuroglancer/v/gateway/", "/neuroglancer", "/favicon.ico")


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = the(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def settings_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The environment the container gets from its ConfigMaps and Secrets (envFrom), decoded."""
    env: dict[str, str] = {}
    by_name = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
    for source in container(docs)["envFrom"]:
        if "configMapRef" in source:
            env.update(by_name["ConfigMap", source["configMapRef"]["name"]]["data"])
        else:
            secret = by_name["Secret", source["secretRef"]["name"]]
            env.update({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})
    return env


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = the(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- schemas and the security scan ------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_for_current_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, version: str
) -> None:
    checked = set()
    for doc in rendered[overlay]:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)  # raises, naming the field, when invalid
        checked.add(doc["kind"])
    expected = {"Namespace", "ServiceAccount", "ConfigMap", "Secret", "Service", "Deployment", "Ingress"}
    expected |= {"HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"}
    assert expected <= checked


def test_the_schema_check_rejects_an_unknown_field(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The validation above is strict: a misspelled field in a rendered object is an error."""
    deployment = json.loads(json.dumps(the(rendered["shared-filesystem"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def accepted_checks() -> dict[str, str]:
    """The checkov checks the README's Kubernetes section accepts, with the reason given for each."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(CKV\w+)` \| [^|]+ \| ([^|]+) \|$", section, re.MULTILINE)
    return {check: reason.strip() for check, reason in rows}


def checkov() -> str:
    installed = subprocess.run([str(REPO / "scripts" / "security-tools")], capture_output=True, text=True)
    if installed.returncode != 0:
        pytest.fail(f"scripts/security-tools could not install checkov: {installed.stderr[-2000:]}")
    return installed.stdout.strip().splitlines()[-1]


def scan(directory: Path, *frameworks: str) -> tuple[int, list[tuple[str, str]]]:
    """checkov over ``directory``, offline: how many checks passed, and each failed check with its file."""
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}  # no guideline download
    command = [checkov(), "-d", str(directory), "--framework", *frameworks, "--skip-download", "--output", "json"]
    run = subprocess.run([*command, "--quiet"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode in (0, 1), run.stderr[-3000:]  # 1: some check failed
    reports = json.loads(run.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    reports = [report for report in reports if "check_type" in report]  # a bare summary: nothing to report
    assert {report["check_type"] for report in reports} == set(frameworks), run.stdout[:2000]
    passed = sum(report["summary"]["passed"] for report in reports)
    failed = [
        (check["check_id"], f"{check['file_path']}: {check['resource']}")
        for report in reports
        for check in report["results"]["failed_checks"]
    ]
    return passed, failed


@pytest.mark.checkov
def test_checkov_fails_no_check_but_those_the_readme_accepts(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Policies over what is deployed (the rendered manifests, the Dockerfile); the secrets scan over the
    files as committed (compose file, nginx.conf, manifests and their examples; rendered Secrets hold the
    test's own values), with a planted key that it must find."""
    manifests = tmp_path / "rendered"
    manifests.mkdir()
    for overlay, docs in rendered.items():
        (manifests / f"{overlay}.yaml").write_text(yaml.safe_dump_all(docs))
    shutil.copy(DOCKERFILE, manifests / "Dockerfile")
    passed, failed = scan(manifests, "kubernetes", "dockerfile")
    assert passed > 100, "checkov ran hardly any check"
    sources = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", sources, ignore=shutil.ignore_patterns(".env", "secrets", "tokens.json", "*.env"))
    # A secret key of the right shape, made up now (the scan passes over AWS's documented EXAMPLE keys).
    # Letters and digits only: checkov's pattern misses a key that starts with "/" (1 draw in 30 did).
    made_up = "".join(random.choices(string.ascii_letters + string.digits, k=40))
    (sources / "planted.yaml").write_text(f'aws_secret_access_key: "{made_up}"\n')
    _, leaked = scan(sources, "secrets")
    planted = [where for _, where in leaked if "planted.yaml" in where]
    assert planted, f"the secrets scan missed the planted key: {leaked}"
    failed += [(check, where) for check, where in leaked if "planted.yaml" not in where]
    accepted = accepted_checks()
    assert all(accepted.values()), "every accepted check needs its reason in the README"
    unexplained = [(check, where) for check, where in failed if check not in accepted]
    assert not unexplained, f"checkov failed checks the README does not list: {unexplained}"
    stale = sorted(set(accepted) - {check for check, _ in failed})
    assert not stale, f"the README lists checks that no longer fail: {stale}"


# --- invariants of the rendered objects -------------------------------------------------------------


def dockerfile_facts() -> dict[str, Any]:
    """The user, port and command the image runs with, read from deploy/Dockerfile."""
    text = DOCKERFILE.read_text()

    def line(pattern: str) -> str:
        found = re.search(pattern, text, re.MULTILINE)
        assert found is not None, f"deploy/Dockerfile has no line like {pattern}"
        return found.group(1)

    return {
        "user": line(r"^USER (\d+):\d+$"),
        "port": line(r"^EXPOSE (\d+)$"),
        "cmd": json.loads(line(r"^CMD (\[.*\])$")),
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_is_locked_down(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    gateway = container(docs)
    security = gateway["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True and security["runAsNonRoot"] is True
    assert str(security["runAsUser"]) == dockerfile_facts()["user"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    for kind in ("requests", "limits"):
        assert set(gateway["resources"][kind]) >= {"cpu", "memory"}, kind
    writable = {mount["mountPath"] for mount in gateway["volumeMounts"] if not mount.get("readOnly")}
    assert writable == {"/tmp"}, "only the scratch directory is writable"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_image_and_settings_match_the_dockerfile_and_the_settings_model(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    gateway = container(docs)
    facts = dockerfile_facts()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert gateway["image"] == f"zarr-gateway:{version}"
    assert gateway["args"] == facts["cmd"] and "command" not in gateway  # the image's ENTRYPOINT runs
    ports = {port["name"]: port["containerPort"] for port in gateway["ports"]}
    env = settings_of(docs)
    assert str(ports["http"]) == facts["port"] == env[f"{ENV_PREFIX}PORT"]
    names = {name[len(ENV_PREFIX) :].lower() for name in env if name.startswith(ENV_PREFIX)}
    assert names <= set(Settings.model_fields), f"not settings: {names - set(Settings.model_fields)}"
    assert "root" in names
    # A pod sees every core of its node: the worker count must follow the container's CPU limit.
    assert int(env[f"{ENV_PREFIX}WORKERS"]) <= int(gateway["resources"]["limits"]["cpu"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shutdown_outlasts_the_drain_and_requests_in_flight(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    env = settings_of(docs)
    pre_stop = container(docs)["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(env[f"{ENV_PREFIX}DRAIN_SECONDS"])
    in_flight = float(env[f"{ENV_PREFIX}GRACEFUL_TIMEOUT"])
    assert pre_stop > 0 and drain > 0, "endpoints need time to drop the pod before its listener closes"
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + in_flight
    strategy = the(docs, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_the_health_routes(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    gateway = container(rendered[overlay])
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # /readyz waits up to 5 s for the data root before it answers 503; the probe must wait longer.
    assert gateway["readinessProbe"]["timeoutSeconds"] > 5
    port_names = {port["name"] for port in gateway["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert gateway[probe]["httpGet"]["port"] in port_names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_sits_in_one_namespace(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    """Secrets generated by an overlay too: a Secret in another namespace is one the pods never find."""
    namespaces = {doc["metadata"].get("namespace") for doc in rendered[overlay] if doc["kind"] != "Namespace"}
    assert namespaces == {the(rendered[overlay], "Namespace")["metadata"]["name"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_budget_autoscaler_and_spread_select_the_gateways(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    labels = pod_labels(docs)
    deployment = the(docs, "Deployment")
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    service = the(docs, "Service")
    assert selects(service["spec"]["selector"], labels)
    port_names = {port["name"] for port in container(docs)["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= port_names
    assert selects(the(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], labels)
    hpa = the(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["minReplicas"] >= 2, "one replica alone cannot roll or lose a node without an outage"
    assert [metric["resource"]["name"] for metric in hpa["metrics"]] == ["cpu"]
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {constraint["topologyKey"] for constraint in spread}
    assert all(selects(constraint["labelSelector"]["matchLabels"], labels) for constraint in spread)


def ingress_matches(ingress_path: dict[str, Any], request_path: str) -> bool:
    """Whether an Ingress path matches a request path, as the Ingress API defines Prefix and Exact."""
    path = str(ingress_path["path"])
    if ingress_path["pathType"] == "Exact":
        return request_path == path
    assert ingress_path["pathType"] == "Prefix", "ImplementationSpecific paths cannot be checked"
    wanted = [part for part in path.split("/") if part]
    return [part for part in request_path.split("/") if part][: len(wanted)] == wanted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ingress_routes_data_but_no_internal_route(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    ingress = the(docs, "Ingress", CHECKED_INGRESS)
    service = the(docs, "Service")
    opened = the(docs, "Ingress", OPEN_INGRESS)
    open_paths = [path for rule in opened["spec"]["rules"] for path in rule["http"]["paths"]]
    paths = [path for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]] + open_paths
    assert "defaultBackend" not in ingress["spec"] and "defaultBackend" not in opened["spec"]
    assert [rule["host"] for rule in opened["spec"]["rules"]] == [rule["host"] for rule in ingress["spec"]["rules"]]
    assert opened["spec"]["tls"] == ingress["spec"]["tls"]
    assert not [key for key in opened["metadata"]["annotations"] if "auth" in key], "sign-in is reached unchecked"
    for route in OPEN_ROUTES:
        assert any(ingress_matches(path, route) for path in open_paths), f"{route} is not routed"
    for data in ("/", "/data/zarr/o/d/.zgroup", "/t/x/data/", "/s/x/data/", "/preview/o/d/c.png", "/share/o/d"):
        assert not any(ingress_matches(path, data) for path in open_paths), f"{data} is routed without a check"
    for route in INTERNAL_ROUTES:
        for variant in (route, route + "/", route + "/x"):
            assert not any(ingress_matches(path, variant) for path in paths), f"{variant} is routed"
    for wanted in (
        "/",
        "/data/zarr/org/dataset/.zgroup",
        "/data/zarr3/org/dataset/color/1/zarr.json",
        "/preview/org/dataset/color.png",  # the images of every dataset page
        "/t/token/data/zarr3/org/dataset/color/zarr.json",  # a token in the path, for viewers
        "/s/s1.link/data/zarr3/org/dataset/",  # a share link
        "/share/org/dataset",  # the dataset page's share form
        *OPEN_ROUTES,
    ):
        assert any(ingress_matches(path, wanted) for path in paths), f"{wanted} is not routed"
    for path in paths:
        backend = path["backend"]["service"]
        assert backend["name"] == service["metadata"]["name"]
        assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ingress_asks_the_gateways_auth_and_caches_per_token_and_dataset(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    annotations = the(docs, "Ingress", CHECKED_INGRESS)["metadata"]["annotations"]
    service = the(docs, "Service")
    prefix = "nginx.ingress.kubernetes.io/"
    auth = re.fullmatch(r"http://([^.]+)\.([^.]+)\.svc\.cluster\.local:(\d+)(/\S*)", annotations[prefix + "auth-url"])
    assert auth is not None, annotations[prefix + "auth-url"]
    name, namespace, port, path = auth.groups()
    assert (name, namespace) == (service["metadata"]["name"], service["metadata"]["namespace"])
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    assert path == "/auth"
    # The gateway decides per dataset; the cached answer must be keyed by both ways a token comes (the
    # header, and ?token= in the query as sent) and by the dataset, which the http-snippet's maps cut out.
    key = annotations[prefix + "auth-cache-key"]
    assert re.fullmatch(r"[A-Za-z0-9\-_${}]*", key), "the controller accepts only variables and letters"
    # So the parts are joined in the http-snippet, where a separator can stand between them.
    assert key == "$zg_auth_cache_key"
    snippet = AUTH_SCOPE.read_text()
    defined = set(re.findall(r"^map \S+ \$(\w+)", snippet, re.MULTILINE))
    parts = {"zg_auth_scope", "zg_request_query", "zg_signin_key", "zg_auth_cache_key"}
    assert parts <= defined, "the snippet defines the key"
    [joined] = re.findall(r'^map "" \$zg_auth_cache_key \{\s*default "([^"]*)";', snippet, re.MULTILINE)
    # the sign-in credentials (Authorization, the login cookie) before the token, spaces between
    assert joined == "$zg_auth_scope $zg_request_query $zg_signin_key $http_x_auth_token", "the token last"
    assert "${" not in AUTH_SCOPE.read_text(), "the snippet is used as it is: it names no template value"
    assert re.fullmatch(r"204 \d+[sm]", annotations[prefix + "auth-cache-duration"]), "only grants are cached"
    assert annotations[prefix + "enable-cors"] == "true"
    for header in ("Range", "X-Auth-Token", "If-None-Match"):
        assert header in annotations[prefix + "cors-allow-headers"]
    for header in ("Content-Range", "Content-Length", "ETag"):
        assert header in annotations[prefix + "cors-expose-headers"]
    # Snippets are refused by current controllers (and would let an Ingress reach around the routing).
    assert not [key for key in annotations if "snippet" in key]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_ingress_controller_and_monitoring_reach_the_gateways(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    policy = the(docs, "NetworkPolicy")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod_labels(docs))
    assert policy["policyTypes"] == ["Ingress"]
    peers = []
    for rule in policy["ingress"]:
        assert [port["port"] for port in rule["ports"]] == ["http"]
        for peer in rule["from"]:
            assert "ipBlock" not in peer
            namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            peers.append((namespace, peer.get("podSelector", {}).get("matchLabels")))
    assert sorted(peers, key=str) == sorted(
        [("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}), ("monitoring", None)], key=str
    )


def test_the_service_monitor_scrapes_the_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["object-storage"]  # the overlay that includes the optional component
    monitor = the(docs, "ServiceMonitor")
    service = the(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert not [doc for doc in rendered["shared-filesystem"] if doc["kind"] == "ServiceMonitor"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_tokens_secret_is_mounted_as_a_directory(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    """A subPath mount never sees an updated Secret; a directory mount does, and the gateway re-reads it."""
    docs = rendered[overlay]
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    tokens_file = Path(settings_of(docs)[f"{ENV_PREFIX}TOKENS_FILE"])
    [mount] = [m for m in container(docs)["volumeMounts"] if Path(m["mountPath"]) == tokens_file.parent]
    assert "subPath" not in mount and mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = the([doc for doc in docs if doc["metadata"]["name"] == volume["secret"]["secretName"]], "Secret")
    assert [item["path"] for item in volume["secret"]["items"]] == [tokens_file.name]
    assert json.loads(base64.b64decode(secret["data"][volume["secret"]["items"][0]["key"]])) == TOKENS
    assert float(settings_of(docs)[f"{ENV_PREFIX}TOKENS_RELOAD_SECONDS"]) > 0


# --- bad input at kustomize time ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overlay", "missing"),
    [
        ("object-storage", "tokens.json"),
        ("object-storage", "s3-credentials.env"),
        ("shared-filesystem", "tokens.json"),
    ],
)
def test_an_overlay_without_its_secret_file_fails_naming_it(
    tree: Path, tmp_path: Path, overlay: str, missing: str
) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(tree, copy)
    (copy / "overlays" / overlay / missing).unlink()
    built = kustomize(copy / "overlays" / overlay)
    assert built.returncode != 0
    assert missing in built.stderr


# --- the real gateway with what a pod gets -----------------------------------------------------------


def write_secret_volume(directory: Path, files: dict[str, bytes], generation: int) -> None:
    """A Secret volume as the kubelet lays it out: files in a timestamped directory behind ``..data``,
    which an update swaps atomically to a new directory."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = directory / f"..2026_01_01_00_00_0{generation}"
    payload.mkdir()
    for name, content in files.items():
        (payload / name).write_bytes(content)
    staged = directory / "..data_tmp"
    staged.symlink_to(payload.name)
    os.replace(staged, directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


def secret_files(docs: list[dict[str, Any]], volume: dict[str, Any]) -> dict[str, bytes]:
    secret = the([doc for doc in docs if doc["metadata"]["name"] == volume["secret"]["secretName"]], "Secret")
    return {item["path"]: base64.b64decode(secret["data"][item["key"]]) for item in volume["secret"]["items"]}


@dataclass
class Pod:
    """A gateway process started as the rendered Deployment would start it, on a loopback port."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    volumes: dict[str, Path]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def pod_environment(docs: list[dict[str, Any]], volumes: dict[str, Path], **overrides: str) -> dict[str, str]:
    """The container's environment with each mount path replaced by the local directory standing in for it,
    and the listener moved to a free loopback port (tests listen on loopback only)."""
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container(docs)["volumeMounts"]}
    env = {}
    for name, value in settings_of(docs).items():
        for mount_path in sorted(mounts, key=len, reverse=True):  # the deepest mount holding the path
            if value == mount_path or value.startswith(mount_path + "/"):
                value = str(mounts[mount_path]) + value[len(mount_path) :]
                break
        env[name] = value
    env[f"{ENV_PREFIX}HOST"] = "127.0.0.1"
    env[f"{ENV_PREFIX}PORT"] = str(free_port())
    env.update(overrides)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith((ENV_PREFIX, "AWS_"))}
    # The pod runs in another directory: it must still import this checkout's gateway package.
    inherited["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**inherited, **env}


def start_pod(docs: list[dict[str, Any]], volumes: dict[str, Path], log_path: Path, **overrides: str) -> Pod:
    env = pod_environment(docs, volumes, **overrides)
    args = [sys.executable, "-m", "gateway", *container(docs)["args"]]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent)
    pod = Pod(f"http://127.0.0.1:{env[f'{ENV_PREFIX}PORT']}", process, log_path, volumes)

    def exited_or_answering() -> bool:
        if process.poll() is not None:
            return True  # exited: the caller reads why
        try:
            requests.get(pod.url + "/healthz", timeout=1)
        except requests.ConnectionError:
            return False
        return True

    if wait_until(exited_or_answering, timeout=60, interval=0.2):
        return pod
    stop(pod)
    pytest.fail(f"the gateway did not start: {pod.log()}")


def stop(pod: Pod) -> None:
    stop_process(pod.process, 60)


def exit_message(docs: list[dict[str, Any]], tmp_path: Path, **overrides: str) -> str:
    volumes = {"tokens": tmp_path / "tokens", "tmp": tmp_path / "scratch", "data": tmp_path / "data"}
    write_secret_volume(volumes["tokens"], {"tokens.json": json.dumps(TOKENS).encode()}, 1)
    volumes["tmp"].mkdir()
    volumes["data"].mkdir()
    pod = start_pod(docs, volumes, tmp_path / "gateway.log", **overrides)
    try:
        pod.process.wait(30)
    except subprocess.TimeoutExpired:
        stop(pod)
        pytest.fail(f"the gateway started although it should not have: {pod.log()}")
    assert pod.process.returncode != 0
    return pod.log()


@pytest.fixture(scope="module")
def filesystem_pod(
    rendered: dict[str, list[dict[str, Any]]], test_data: WrittenDataset, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pod]:
    """The shared-filesystem overlay's pod over the test data root, its tokens in a kubelet-style volume."""
    docs = rendered["shared-filesystem"]
    here = tmp_path_factory.mktemp("filesystem-pod")
    pod_spec = the(docs, "Deployment")["spec"]["template"]["spec"]
    [tokens_volume] = [v for v in pod_spec["volumes"] if "secret" in v]
    volumes = {tokens_volume["name"]: here / "secret", "tmp": here / "tmp", "data": test_data.root}
    write_secret_volume(volumes[tokens_volume["name"]], secret_files(docs, tokens_volume), 1)
    volumes["tmp"].mkdir()
    pod = start_pod(docs, volumes, here / "gateway.log")
    if pod.process.poll() is not None:
        pytest.fail(f"the gateway exited: {pod.log()}")
    yield pod
    stop(pod)


def test_the_probed_and_routed_paths_are_real_routes(
    filesystem_pod: Pod, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    gateway = container(rendered["shared-filesystem"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        answer = requests.get(filesystem_pod.url + gateway[probe]["httpGet"]["path"], timeout=10)
        assert answer.status_code == 200, (probe, answer.text)
    for route in INTERNAL_ROUTES:
        assert requests.get(filesystem_pod.url + route, timeout=10).status_code != 404, route
    assert requests.get(filesystem_pod.url + "/", headers={"X-Auth-Token": TOKEN}, timeout=10).status_code == 200
    group = requests.get(f"{filesystem_pod.url}/data/zarr/{ORG}/wk_dataset/.zgroup", headers={"X-Auth-Token": TOKEN})
    assert group.status_code == 200 and group.json()["zarr_format"] == 2
    metrics = requests.get(filesystem_pod.url + "/metrics", timeout=10)
    assert "zarr_gateway_requests_total" in metrics.text


def ingress_auth(pod: Pod, uri: str, token: str | None = None) -> int:
    """The subrequest ingress-nginx sends to auth-url (with auth-method set): X-Original-URL and -URI."""
    headers = {
        "X-Original-URL": f"https://zarr.example.org{uri}",
        "X-Original-URI": uri,
        "X-Original-Method": "GET",
        "X-Sent-From": "nginx-ingress-controller",
    }
    if token:
        headers["X-Auth-Token"] = token
    return requests.get(pod.url + "/auth", headers=headers, timeout=10).status_code


def test_the_auth_url_decides_as_the_data_routes_do(filesystem_pod: Pod) -> None:
    mine = f"/data/zarr/{ORG}/wk_dataset/color_u8/1/0.0.0.0"
    assert ingress_auth(filesystem_pod, mine, TOKEN) == 204
    assert ingress_auth(filesystem_pod, f"{mine}?token={TOKEN}") == 204
    assert ingress_auth(filesystem_pod, mine) == 401
    assert ingress_auth(filesystem_pod, mine, "not-a-token") == 401
    assert ingress_auth(filesystem_pod, "/data/zarr/other_org/theirs/.zgroup", TOKEN) == 403


# --- the Ingress's annotations under a real nginx ------------------------------------------------------

CONTROLLER = """daemon off;
{user}worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/temp/body;
    proxy_temp_path {dir}/temp/proxy;
    fastcgi_temp_path {dir}/temp/fastcgi;
    uwsgi_temp_path {dir}/temp/uwsgi;
    scgi_temp_path {dir}/temp/scgi;
    proxy_cache_path {dir}/auth-cache levels=1:2 keys_zone=auth_cache:1m;
    # The controller's http-snippet.
    include {auth_scope};
    server {{
        listen 127.0.0.1:{port};
{locations}
    }}
}}
"""

AUTH_LOCATION = """        location = /_external-auth {{
            internal;
            set $tmp_cache_key '{host}/_external-auth{cache_key}';
            proxy_cache auth_cache;
            proxy_cache_valid {cache_duration};
            proxy_cache_key "$tmp_cache_key";
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_method {method};
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-URL $scheme://$http_host$request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_pass {auth_url};
        }}
"""


@dataclass
class Controller:
    url: str
    process: subprocess.Popen[bytes]
    directory: Path


def nginx() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if path is None:
        pytest.fail("nginx is missing: run scripts/install-system-packages (scripts/test does)")
    return path


@pytest.fixture(scope="module")
def controller(
    filesystem_pod: Pod, rendered: dict[str, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    """nginx configured from the rendered Ingress the way ingress-nginx turns its rules and auth annotations
    into locations (an auth subrequest location with the cache key and duration, one location per path,
    404 for any other path), in front of the pod; the Service's DNS name stands for the pod's address."""
    ingress = the(rendered["shared-filesystem"], "Ingress", CHECKED_INGRESS)
    [open_rule] = the(rendered["shared-filesystem"], "Ingress", OPEN_INGRESS)["spec"]["rules"]
    annotations = {
        k.removeprefix("nginx.ingress.kubernetes.io/"): v for k, v in ingress["metadata"]["annotations"].items()
    }
    [rule] = ingress["spec"]["rules"]
    auth_path = urlsplit(annotations["auth-url"]).path
    locations = [
        AUTH_LOCATION.format(
            host=rule["host"],
            cache_key=annotations["auth-cache-key"],
            cache_duration=annotations["auth-cache-duration"],
            method=annotations["auth-method"],
            auth_url=filesystem_pod.url + auth_path,
        )
    ]
    checked = f"auth_request /_external-auth;\n            proxy_pass {filesystem_pod.url};"
    unchecked = f"proxy_pass {filesystem_pod.url};"  # the open Ingress has no auth-url
    for paths, routed in ((rule["http"]["paths"], checked), (open_rule["http"]["paths"], unchecked)):
        for path in paths:
            if path["pathType"] == "Exact":
                matches = [f"= {path['path']}"]
            else:
                matches = [f"= {path['path']}", path["path"].rstrip("/") + "/"] if path["path"] != "/" else ["/"]
            locations += [f"        location {match} {{\n            {routed}\n        }}\n" for match in matches]
    if not any(path["pathType"] == "Prefix" and path["path"] == "/" for path in rule["http"]["paths"]):
        locations.append("        location / {\n            return 404;\n        }\n")  # the default backend
    directory = tmp_path_factory.mktemp("controller")
    for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / "temp" / temp).mkdir(parents=True)
    port = free_port()
    config = directory / "nginx.conf"
    # Run as root (as the tests run in CI), workers would drop to a user that cannot write the cache here.
    user = "user root;\n" if os.geteuid() == 0 else ""
    config.write_text(
        CONTROLLER.format(user=user, dir=directory, port=port, locations="".join(locations), auth_scope=AUTH_SCOPE)
    )
    command = [nginx(), "-c", str(config), "-p", str(directory)]
    check = subprocess.run([*command, "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    with open(directory / "stderr.log", "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    started = Controller(f"http://127.0.0.1:{port}", process, directory)
    if not wait_until(lambda: _answers(started.url), timeout=20, interval=0.2):
        process.kill()
        pytest.fail(f"nginx did not start: {(directory / 'error.log').read_text()}")
    yield started
    stop_process(process, stop_signal=signal.SIGQUIT)  # nginx's graceful stop


def _answers(url: str) -> bool:
    try:
        requests.get(url + "/healthz", timeout=1)
        return True
    except requests.ConnectionError:
        return False


def gateway_requests(pod: Pod, *paths: str) -> int:
    """How many requests for any of ``paths`` the gateway has logged (one JSON access line each), once its log
    has stopped growing: each worker writes its access lines just after its answers, later on a busy machine,
    so a count read at once can miss the last ones (and a count to compare with later be too low)."""
    log = pod.log()
    deadline = time.monotonic() + 10  # a bound on waiting, not a measure
    while time.monotonic() < deadline:
        time.sleep(0.25)
        log, before = pod.log(), log
        if log == before:
            break
    count = 0
    for line in log.splitlines():
        if line.startswith("{") and '"gateway.access"' in line:
            count += json.loads(line)["path"] in paths
    return count


@pytest.mark.nginx
def test_through_the_ingress_sign_in_the_viewer_and_the_favicon_reach_the_gateways(controller: Controller) -> None:
    """The open Ingress's paths reach the gateway unchecked (no credential is needed to start a sign-in), and
    answer as the gateway does: this pod has no issuer, so its sign-in paths are its own 404 (JSON that says
    nothing is there), never the controller's default backend; every data path stays checked."""
    for path in ("/login", "/callback", "/logout"):
        answer = requests.get(controller.url + path, allow_redirects=False, timeout=10)
        assert answer.status_code == 404 and "nothing at" in answer.json()["error"], (path, answer.text[:200])
    icon = requests.get(controller.url + "/favicon.ico", timeout=10)
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/"), icon.headers
    viewer = requests.get(controller.url + "/neuroglancer/v/gateway/", timeout=30)
    assert viewer.status_code in (200, 404) and viewer.headers.get("x-request-id"), viewer.text[:200]
    default = requests.get(controller.url + "/nothing", timeout=10)  # the default backend answers the rest
    assert default.status_code == 404 and "x-request-id" not in default.headers
    assert requests.get(controller.url + "/data/zarr/", timeout=10).status_code == 401


@pytest.mark.nginx
def test_through_the_ingress_every_read_is_authenticated(controller: Controller) -> None:
    uri = f"/data/zarr/{ORG}/wk_dataset/color_u8/1/.zarray"
    assert requests.get(controller.url + uri, timeout=10).status_code == 401
    assert requests.get(controller.url + uri, headers={"X-Auth-Token": "not-a-token"}, timeout=10).status_code == 401
    answer = requests.get(controller.url + uri, headers={"X-Auth-Token": TOKEN}, timeout=10)
    assert answer.status_code == 200 and answer.json()["zarr_format"] == 2
    assert requests.get(f"{controller.url}{uri}?token={TOKEN}", timeout=10).status_code == 200
    assert requests.get(controller.url + uri, headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10).status_code == 403
    theirs = "/data/zarr/other_org/theirs/.zgroup"
    assert requests.get(controller.url + theirs, headers={"X-Auth-Token": TOKEN}, timeout=10).status_code == 403


@pytest.mark.nginx
def test_through_the_ingress_grants_are_cached_per_token_and_dataset(
    controller: Controller, filesystem_pod: Pod
) -> None:
    """One check per token and dataset: every other request of that dataset is one gateway request.

    A query no other test sends keeps the keys of this test apart from the cache entries of others.
    """
    probe = f"?cache-probe={random.randrange(1 << 30)}"
    prefix = f"/data/zarr/{ORG}/wk_dataset/color_u8/1/"
    paths = [prefix + name for name in (".zarray", "0.1.1.0", "0.2.1.0", "0.1.2.0", "0.2.2.1", ".zattrs")]
    before = gateway_requests(filesystem_pod, "/auth")
    data_before = gateway_requests(filesystem_pod, *paths)

    def auth_calls() -> int:
        return gateway_requests(filesystem_pod, "/auth") - before

    def get(path: str, token: str) -> int:
        """The path sent exactly as written (requests would turn an escaped "." back into a ".")."""
        connection = http.client.HTTPConnection(urlsplit(controller.url).netloc, timeout=10)
        try:
            connection.request("GET", path, headers={"X-Auth-Token": token})
            return connection.getresponse().status
        finally:
            connection.close()

    assert get(paths[0] + probe, "not-a-token") == 401
    assert get(paths[0] + probe, "not-a-token") == 401
    assert auth_calls() == 2, "refusals are not cached: a new token works at once"
    for path in paths:
        assert get(path + probe, TOKEN) == 200
    assert auth_calls() == 3, "a grant is asked for once per dataset, then cached for its other paths"
    data_after = gateway_requests(filesystem_pod, *paths)
    assert data_after - data_before == len(paths), "each data request costs one gateway request, no more"
    # Another token, another query, another dataset, or a path with an escape: asked again.
    assert get(paths[0] + probe, OTHER_TOKEN) == 403
    assert get(paths[1] + probe + "-2", TOKEN) == 200
    assert get("/data/zarr/other_org/theirs/color_u8/1/.zarray" + probe, OTHER_TOKEN) == 200
    assert get(prefix + "%2Ezarray" + probe, TOKEN) == 200
    assert get(prefix + "%2Ezattrs" + probe, TOKEN) == 200
    assert auth_calls() == 8


@pytest.mark.nginx
def test_through_the_ingress_a_path_token_is_routed_checked_and_cached_per_token_and_dataset(
    controller: Controller, filesystem_pod: Pod
) -> None:
    """``/t/{token}/data/...`` (the token viewers carry in their source URLs) is routed, judged as a header
    token is, and its grant cached per token and dataset."""
    probe = f"?cache-probe={random.randrange(1 << 30)}"
    prefix = f"/data/zarr/{ORG}/wk_dataset/color_u8/1/"
    paths = [prefix + name for name in (".zarray", "0.1.1.0", "0.2.1.0", "0.1.2.0", ".zattrs")]
    before = gateway_requests(filesystem_pod, "/auth")

    def auth_calls() -> int:
        return gateway_requests(filesystem_pod, "/auth") - before

    def get(path: str, token: str, **headers: str) -> int:
        return requests.get(f"{controller.url}/t/{token}{path}{probe}", headers=headers, timeout=10).status_code

    assert get(paths[0], "not-a-token") == 401
    for path in paths:
        assert get(path, TOKEN) == 200
    assert auth_calls() == 2, "a grant is asked for once per token and dataset, then cached for its other paths"
    assert get(paths[0], OTHER_TOKEN) == 403
    assert get("/data/zarr/other_org/theirs/color_u8/1/.zarray", OTHER_TOKEN) == 200
    assert get("/data/zarr/other_org/theirs/color_u8/1/.zarray", TOKEN) == 403
    assert auth_calls() == 5
    assert get(paths[0], TOKEN, **{"X-Auth-Token": TOKEN}) == 400, "two tokens: the gateway's own 400"
    assert TOKEN not in filesystem_pod.log(), "the pod logs a path token as /t/***"


@pytest.mark.nginx
def test_through_the_ingress_the_previews_of_a_dataset_page_are_served(controller: Controller) -> None:
    page = requests.get(f"{controller.url}/data/zarr/{ORG}/wk_dataset/", params={"token": TOKEN}, timeout=10)
    assert page.status_code == 200
    previews = re.findall(r'<img class="preview" src="([^"]+)"', page.text)
    assert previews, "the page shows previews"
    for preview in previews:
        image = requests.get(controller.url + html.unescape(preview), timeout=30)
        assert image.status_code == 200 and image.content.startswith(b"\x89PNG"), preview
    assert requests.get(f"{controller.url}{html.unescape(previews[0]).split('?')[0]}", timeout=10).status_code == 401
    # the page's absolute URLs name the Ingress's host (the public_url setting), not the one the client sent
    assert "https:&#47;&#47;zarr.example.org&#47;data&#47;" in page.text


@pytest.mark.nginx
@pytest.mark.parametrize(("query", "headers"), REPEATED_TOKENS)
def test_through_the_ingress_more_than_one_token_is_a_400(
    controller: Controller, query: str, headers: list[str]
) -> None:
    """Even after a grant for the real token was cached for the dataset: a token is one token."""
    path = f"/data/zarr/{ORG}/wk_dataset/color_u8/1/.zarray"
    assert requests.get(controller.url + path, headers={"X-Auth-Token": TOKEN}, timeout=10).status_code == 200
    lines = "".join(f"X-Auth-Token: {value}\r\n" for value in headers)
    answer = raw_exchange(
        controller.url, f"GET {path}{query} HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"more than one token" in answer


@pytest.mark.nginx
@pytest.mark.parametrize("route", INTERNAL_ROUTES)
def test_through_the_ingress_internal_routes_are_not_found(
    controller: Controller, filesystem_pod: Pod, route: str
) -> None:
    before = gateway_requests(filesystem_pod, route)
    for path in (route, route + "/", f"/data/..{route}", f"/data/%2e%2e{route}"):
        answer = requests.get(controller.url + path, headers={"X-Auth-Token": TOKEN}, timeout=10)
        assert answer.status_code == 404, (path, answer.status_code)
    assert gateway_requests(filesystem_pod, route) == before
    assert requests.get(controller.url + "/", headers={"X-Auth-Token": TOKEN}, timeout=10).status_code == 200


def test_a_changed_tokens_secret_reaches_the_running_gateway(
    filesystem_pod: Pod, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The kubelet swaps ``..data`` to the new contents; the gateway re-reads the file, no restart."""
    uri = f"/data/zarr/{ORG}/wk_dataset/.zgroup"
    assert ingress_auth(filesystem_pod, uri, TOKEN) == 204
    new_token = "token-after-the-secret-changed"
    updated = {"tokens": {new_token: [f"{ORG}/*"]}}
    [directory] = [path for name, path in filesystem_pod.volumes.items() if name == "tokens"]
    write_secret_volume(directory, {"tokens.json": json.dumps(updated).encode()}, 2)

    # Each worker re-reads the file on its own within ZARR_GATEWAY_TOKENS_RELOAD_SECONDS: wait until a run
    # of answers (over new connections, so over both workers) all agree with the new file.
    def switched() -> bool:
        return ingress_auth(filesystem_pod, uri, new_token) == 204 and ingress_auth(filesystem_pod, uri, TOKEN) == 401

    seen = wait_until(lambda: all(switched() for _ in range(10)), timeout=20, interval=0.2)
    assert seen, filesystem_pod.log()[-2000:]
    assert filesystem_pod.process.poll() is None


def test_an_overlay_with_an_unknown_setting_stops_start_up_naming_it(tree: Path, tmp_path: Path) -> None:
    """A misspelled setting merged into the settings ConfigMap by an operator's own overlay."""
    overlay = tree / "overlays" / "misspelled"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../shared-filesystem"],
                "configMapGenerator": [
                    {"name": "zarr-gateway-settings", "behavior": "merge", "literals": ["ZARR_GATEWAY_CHUNK_EGDE=64"]}
                ],
            }
        )
    )
    docs = render(overlay)
    assert settings_of(docs)["ZARR_GATEWAY_CHUNK_EGDE"] == "64"
    log = exit_message(docs, tmp_path)
    assert "ZARR_GATEWAY_CHUNK_EGDE" in log and "unknown setting" in log


def test_the_base_alone_stops_start_up_naming_the_missing_root(tree: Path, tmp_path: Path) -> None:
    """The base leaves the data root to an overlay: deployed alone, the gateway says so and exits."""
    log = exit_message(render(tree / "base"), tmp_path)
    assert "root" in log and "invalid settings" in log


@pytest.mark.slow  # a pod's gateway waits out its start-up probes of a store that never answers
def test_an_unreachable_store_keeps_the_pod_unready_and_says_why(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = rendered["object-storage"]
    closed = f"http://127.0.0.1:{free_port()}"  # bound once and closed: nothing listens there
    pod_spec = the(docs, "Deployment")["spec"]["template"]["spec"]
    [tokens_volume] = [v for v in pod_spec["volumes"] if "secret" in v]
    volumes = {tokens_volume["name"]: tmp_path / "secret", "tmp": tmp_path / "tmp"}
    write_secret_volume(volumes[tokens_volume["name"]], secret_files(docs, tokens_volume), 1)
    volumes["tmp"].mkdir()
    pod = start_pod(docs, volumes, tmp_path / "gateway.log", AWS_ENDPOINT_URL=closed)
    try:
        assert pod.process.poll() is None, f"the gateway exited: {pod.log()}"
        assert pod_environment(docs, volumes)["AWS_ACCESS_KEY_ID"] == "k8s-test-key"  # from the rendered Secret
        assert requests.get(pod.url + "/healthz", timeout=10).status_code == 200  # alive: no restart loop
        ready = requests.get(pod.url + "/readyz", timeout=15)
        assert ready.status_code == 503
        assert "cannot be reached" in ready.json()["problem"]
        assert wait_until(lambda: "not ready" in pod.log(), timeout=20, interval=0.2)
        log = pod.log()
        assert closed in log and "cannot be reached" in log
        data = requests.get(pod.url + f"/data/zarr/{ORG}/wk_dataset/.zgroup", headers={"X-Auth-Token": TOKEN})
        assert data.status_code >= 500, "a store fault is never a 404"
    finally:
        stop(pod)
