"""The dependency rule of docs/architecture.md, checked on the source: HTTP edge -> Zarr protocol ->
sources -> formats -> the storage kernel, nothing lower importing anything higher, the kernel a leaf,
and no import cycle between modules, type-only imports (under ``if TYPE_CHECKING``) included."""

import ast
import builtins
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "gateway_storage", "wkw_adapter")

# Lower number = lower layer. A module may import its own layer and any lower one.
LAYERS = [
    (0, ("gateway_storage",)),  # the storage kernel and its geometry: a leaf (see test_the_storage_kernel_is_a_leaf)
    (
        0,
        ("gateway.logs", "gateway.metrics", "gateway.probe", "gateway.extras", "gateway.heap", "gateway.settings"),
    ),  # leaves: import nothing of the project (the settings: nothing but the kernel's store kinds)
    # on the kernel alone: the WKW format; what a route answers with; the shard formats (on nothing of the project)
    (1, ("wkw_adapter", "gateway.resources", "gateway.shard_formats")),
    (2, ("gateway.sources",)),
    (3, ("gateway.zarr", "gateway.meshes", "gateway.precomputed")),  # protocols over the sources, side by side
    (4, ("gateway.previews", "gateway.sample", "gateway.batch")),  # batch: block tasks over layers
    (5, ("gateway.http",)),
    (6, ("gateway.startup", "gateway.cli", "gateway.serving", "gateway.__main__", "gateway")),
]


def layer_of(module: str) -> int:
    best = (-1, -1)
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), layer))
    assert best[1] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Project modules imported by ``path``, wherever the import statement stands."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def resolve(target: str, known: dict[str, Path]) -> str | None:
    """The module a dotted import names (``a.b.name`` may be the name ``name`` of module ``a.b``)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


@functools.cache
def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {resolve(t, known) for t in imports(path)}
        edges[name] = {t for t in targets if t is not None and t != name and not name.startswith(t + ".")}
    return edges


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_imports_a_higher_layer(module: str) -> None:
    mine = layer_of(module)
    upward = sorted(t for t in graph()[module] if layer_of(t) > mine)
    assert not upward, f"{module} (layer {mine}) imports higher layers: {upward}"


def _outside(module: str, allowed: tuple[str, ...]) -> list[str]:
    return sorted(t for t in graph()[module] if not any(t == a or t.startswith(a + ".") for a in allowed))


@pytest.mark.parametrize("module", sorted(m for m in modules() if m.split(".")[0] == "gateway_storage"))
def test_the_storage_kernel_is_a_leaf(module: str) -> None:
    """Identity, stores, containment and storage errors import nothing of the project but the kernel."""
    assert not _outside(module, ("gateway_storage",)), f"{module} imports {_outside(module, ('gateway_storage',))}"


@pytest.mark.parametrize("module", sorted(m for m in modules() if m.split(".")[0] == "wkw_adapter"))
def test_the_wkw_format_uses_only_the_storage_kernel(module: str) -> None:
    allowed = ("wkw_adapter", "gateway_storage")
    assert not _outside(module, allowed), f"{module} imports {_outside(module, allowed)}"


def test_the_settings_are_a_leaf() -> None:
    """The one settings model imports nothing of the project but the kernel (its table of store kinds), so every
    layer may read its defaults (``MESH_SECONDS``, ``STAMP_FILES``) and no change below it reaches the settings."""
    outside = _outside("gateway.settings", ("gateway_storage",))
    assert not outside, f"gateway.settings imports {outside}"
    assert graph()["gateway.settings"], "the check sees the settings' imports (gateway_storage)"


@pytest.mark.parametrize("module", sorted(m for m in modules() if m.startswith("gateway.shard_formats")))
def test_the_shard_formats_stand_alone(module: str) -> None:
    """Each shard format is bytes in, facts out: sources, the Zarr protocol and the meshes use it, it uses none
    of them (nor the kernel: it reads no store; only the kinds of fault its errors subclass, the bottom of all)."""
    allowed = ("gateway.shard_formats", "gateway_storage.faults")
    assert not _outside(module, allowed), f"{module} imports {_outside(module, allowed)}"


def test_the_leaf_checks_see_a_planted_import(tmp_path: Path) -> None:
    """The leaf rule can fail: a kernel module importing the WKW format is caught."""
    planted = tmp_path / "gateway_storage" / "bad.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from wkw_adapter import WkwError\n")
    found = imports(planted, tmp_path)
    assert "wkw_adapter" in found and not all(t.startswith("gateway_storage") for t in found)


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_the_checker_sees_a_planted_upward_import(tmp_path: Path) -> None:
    """The rule can fail: a type-only import of the HTTP layer from a source module is caught."""
    planted = tmp_path / "gateway" / "sources" / "bad.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..http.app import create_app\n")
    found = imports(planted, tmp_path)
    assert "gateway.http.app" in found
    assert layer_of("gateway.http.app") > layer_of(module_name(planted, tmp_path))


def test_the_scripts_import_nothing_of_the_tests() -> None:
    """The benchmark shares code with the tests through modules both may import (scripts/chromium_devtools.py,
    deploy/render.py), never through the tests' own support package."""
    tests = {"tests", "support", "conftest", *(path.stem for path in (ROOT / "tests").glob("test_*.py"))}
    found = []
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.partition(".")[0] in tests]
    assert not found, f"scripts import the tests' modules: {found}"


# What gateway/meshes may not do itself: open, read or write a file's bytes. Its indexes, labels and voxels come
# through a Store (containment, versions, size bounds); index-segments writes the index from the command line.
# The data stamp (gateway/meshes/index.py) walks the local mag directories' names and stats, which no store lists.
FILE_BYTE_CALLS = {"open", "read_bytes", "read_text", "write_bytes", "write_text", "fromfile"}  # os.* below
FILE_MODULES = {"pathlib", "tempfile", "shutil", "mmap", "io.open"}
STAMP_CALLS = {"walk", "stat", "path"}  # os.walk, os.stat, os.path.*: names and stats, never bytes


def file_access(path: Path) -> list[str]:
    """Calls and imports in ``path`` that reach a file's bytes other than through a store."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
            if name in FILE_BYTE_CALLS:
                found.append(f"line {node.lineno}: {name}()")
        on_os = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
        if on_os and isinstance(node, ast.Attribute) and node.attr not in STAMP_CALLS:
            found.append(f"line {node.lineno}: os.{node.attr}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in FILE_MODULES]
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "gateway" / "meshes").rglob("*.py")), ids=lambda p: p.name)
def test_meshes_read_only_through_stores(path: Path) -> None:
    assert not file_access(path), f"{path.name} reaches files itself: {file_access(path)}"


def test_the_store_rule_sees_planted_file_access(tmp_path: Path) -> None:
    """The rule can fail: each way the old index reading and writing reached a file is caught."""
    planted = tmp_path / "bad.py"
    planted.write_text(
        "import os\nimport tempfile\nfrom pathlib import Path\n"
        "data = Path('x').read_bytes()\nfd, name = tempfile.mkstemp()\nos.replace(name, 'y')\nopen('z')\n"
    )
    found = " ".join(file_access(planted))
    for needle in ("import pathlib", "import tempfile", "read_bytes()", "os.replace", "open()"):
        assert needle in found, (needle, found)


def test_the_units_of_webknossos_are_defined_once_and_imported_directly() -> None:
    """``meters_per_unit`` lives in gateway/sources/units.py; the meshes and the pages import it from there."""
    defining = [
        name
        for name, path in modules().items()
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "meters_per_unit"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert defining == ["gateway.sources.units"], defining
    assert "gateway.sources.units" in graph()["gateway.meshes.layers"]


FRAMEWORK_MODULES = ("gateway.http.edge", "gateway.http.app")  # the application and its composition root


def _imports_starlette(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(name == "starlette" or name.startswith("starlette.") for name in names):
            return True
    return False


def test_starlette_stays_at_the_edge() -> None:
    """The handlers (data, ops, responses...) see the gateway's own Request and Answer, never the framework's:
    the chunk path builds no framework object, and the framework can be swapped in two modules."""
    users = sorted(name for name, path in modules().items() if _imports_starlette(path))
    assert set(users) <= set(FRAMEWORK_MODULES), f"outside the edge: {sorted(set(users) - set(FRAMEWORK_MODULES))}"
    assert "gateway.http.edge" in users  # the check sees what it looks for


def test_the_framework_check_sees_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "handler.py"
    planted.write_text("if True:\n    from starlette.responses import Response\n")
    assert _imports_starlette(planted)
    planted.write_text("from .starlette import x\nimport starlet\n")
    assert not _imports_starlette(planted)


# What the precomputed tree may use of its neighbours: the sources, the mesh service it delegates to (and the
# names of its files), resources and ETags (gateway/resources.py), and the protocol-neutral pieces of the Zarr
# layer (key and node errors), nothing of Zarr's own.
PRECOMPUTED_USES = (
    "gateway.precomputed",
    "gateway.sources",
    "gateway.meshes.service",
    "gateway.meshes.errors",
    "gateway.meshes.formats",
    "gateway.resources",
    "gateway.zarr.keys",
    "gateway.zarr.trees",
    "gateway.extras",
    "gateway_storage",
)


@pytest.mark.parametrize("module", sorted(m for m in modules() if m.startswith("gateway.precomputed")))
def test_the_precomputed_tree_keeps_to_its_boundary(module: str) -> None:
    assert not _outside(module, PRECOMPUTED_USES), f"{module} imports {_outside(module, PRECOMPUTED_USES)}"


@pytest.mark.parametrize("module", sorted(m for m in modules() if m.startswith(("gateway.zarr", "gateway.meshes"))))
def test_the_other_protocols_do_not_use_the_precomputed_tree(module: str) -> None:
    assert not [t for t in graph()[module] if t.startswith("gateway.precomputed")], module


# The HTTP layer is rooms of one concept each: one handler per resource (gateway/http/handlers/), small shared
# collaborators, dispatch by level through a table. A class with more public methods than this does more than one
# thing (the hub it replaced, Gateway, had eleven).
MAX_PUBLIC_METHODS = 6


def public_methods(path: Path) -> dict[str, list[str]]:
    """Each class of ``path`` with its public methods (properties included)."""
    return {
        node.name: [
            item.name
            for item in node.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_")
        ]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }


@pytest.mark.parametrize("path", sorted((ROOT / "gateway" / "http").rglob("*.py")), ids=str)
def test_no_class_of_the_http_layer_is_a_hub(path: Path) -> None:
    hubs = {name: methods for name, methods in public_methods(path).items() if len(methods) > MAX_PUBLIC_METHODS}
    assert not hubs, f"{path.relative_to(ROOT)}: classes of more than {MAX_PUBLIC_METHODS} public methods: {hubs}"


def test_the_hub_check_sees_a_planted_hub(tmp_path: Path) -> None:
    planted = tmp_path / "hub.py"
    methods = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(MAX_PUBLIC_METHODS + 1))
    planted.write_text(f"class Hub:\n{methods}    def _private(self) -> None: ...\n")
    assert len(public_methods(planted)["Hub"]) == MAX_PUBLIC_METHODS + 1


def test_the_data_routes_are_dispatched_by_a_table_not_a_ladder() -> None:
    """No module of the HTTP layer compares a target's level: each level's handler is looked up in one table."""
    ladders = []
    for path in sorted((ROOT / "gateway" / "http").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Attribute) and side.attr == "level" for side in (node.left, *node.comparators)
            ):
                ladders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not ladders, f"levels compared (dispatch through the table of gateway/http/app.py): {ladders}"


# The rooms of the HTML pages and of proxy trust: pages render what they are given (datasets, URLs, the
# viewer's files) and know nothing of the handlers, the edge or the composition root; proxy trust is a leaf.
PAGES_MAY_USE = (
    "gateway.http.pages",
    "gateway.http.urls",
    "gateway.http.messages",
    "gateway.sources.dataset",  # the values of a loaded dataset (the catalog keeps them)
    "gateway.sources.units",
    "gateway.resources",
    "gateway.extras",
    "gateway_storage",
)


@pytest.mark.parametrize("module", sorted(name for name in modules() if name.startswith("gateway.http.pages")))
def test_the_pages_use_only_what_they_render(module: str) -> None:
    outside = sorted(
        target
        for target in graph()[module]
        if not any(target == allowed or target.startswith(allowed + ".") for allowed in PAGES_MAY_USE)
    )
    assert not outside, f"{module} imports {outside}: pages get what they render from the handlers"


def test_proxy_trust_is_a_leaf() -> None:
    assert graph()["gateway.http.origin"] == set(), "origin.py decides from headers and settings alone"


# One error map, by kind: every exception class of the project subclasses a kind of gateway_storage/faults.py (the
# leaf at the bottom of the order), and the map (gateway/http/errors.py) answers kinds, never the classes below them.
FAULTS = "gateway_storage.faults"
ERROR_MAP = "gateway.http.errors"
BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def exception_classes(paths: dict[str, Path]) -> dict[str, tuple[str, list[str]]]:
    """Every class of ``paths`` by name, with its module and the names of its bases (the last dotted part); a
    name that two modules give a class holds the bases of both."""
    found: dict[str, tuple[str, list[str]]] = {}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base).rpartition(".")[2] for base in node.bases]
                earlier = found.get(node.name, (module, []))
                found[node.name] = (earlier[0], earlier[1] + bases)
    return found


def ancestors(name: str, classes: dict[str, tuple[str, list[str]]]) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for base in classes.get(todo.pop(), ("", []))[1]:
            if base not in seen:
                seen.add(base)
                todo.append(base)
    return seen


def kinds() -> set[str]:
    from gateway_storage.faults import KINDS

    return {kind.__name__ for kind in KINDS}


def unkinded(classes: dict[str, tuple[str, list[str]]]) -> list[str]:
    """The exception classes outside the faults module that subclass no kind."""
    return sorted(
        f"{module}.{name}"
        for name, (module, _) in classes.items()
        if module != FAULTS
        and ancestors(name, classes) & BUILTIN_EXCEPTIONS
        and not ancestors(name, classes) & (kinds() | {"HttpError"})
        and name != "HttpError"  # the HTTP layer's own answer: a Fault whose status is its own
    )


def test_every_exception_class_subclasses_a_kind() -> None:
    classes = exception_classes(modules())
    assert not unkinded(classes), f"exception classes of no kind (gateway_storage/faults.py): {unkinded(classes)}"
    counted = [n for n, (m, _) in classes.items() if m != FAULTS and ancestors(n, classes) & BUILTIN_EXCEPTIONS]
    assert len(counted) > 40  # the check sees the classes it looks for


def test_the_kind_check_sees_a_planted_exception(tmp_path: Path) -> None:
    planted = tmp_path / "bad.py"
    planted.write_text(
        "class Base(LookupError):\n    pass\n\n\nclass Gone(Base):\n    pass\n\n\nclass Fine(Absent):\n    pass\n"
    )
    assert unkinded(exception_classes({"gateway.bad": planted})) == ["gateway.bad.Base", "gateway.bad.Gone"]


def test_the_error_map_imports_no_exception_but_the_kinds() -> None:
    """The map answers kinds: of the exception classes it imports, only the kinds and HttpError (the HTTP layer's
    own answer, with its status); no module of fault classes but the faults module."""
    classes = exception_classes(modules())
    imported = {
        alias.name
        for node in ast.walk(ast.parse(modules()[ERROR_MAP].read_text()))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    exceptions = {name for name in imported if name in classes and ancestors(name, classes) & BUILTIN_EXCEPTIONS}
    assert exceptions - {"HttpError"} <= kinds() | {"Fault"}, sorted(exceptions - kinds())
    assert {"Absent", "Broken"} <= exceptions  # the check sees what it looks for
    assert FAULTS in graph()[ERROR_MAP]
    assert layer_of(FAULTS) == 0 and not _outside(FAULTS, ()), "the faults module imports nothing of the project"


# The URL table (gateway/http/urls.py) is the one list of the places the gateway answers: the routes and the metric
# labels are made from it, and the deployment's proxies name only its places (or the credential prefixes in front
# of them): a place renamed there and not here, or added here and routed nowhere, is caught.
CREDENTIAL_PREFIXES = ("/t", "/s")
PROXY_OWN = "/.zarr-gateway/"  # nginx's internal answers to requests it could not read: no gateway's place


def proxy_paths() -> set[str]:
    """The paths the shipped proxies name: nginx's exact and prefix locations (but those below PROXY_OWN, which
    only its own error pages reach), its sign-in regex, the Ingresses'."""
    import re

    import yaml

    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    located = re.findall(r"^\s*location (?:=|\^~) (\S+) \{", conf, re.MULTILINE)
    assert any(path.startswith(PROXY_OWN) for path in located)  # the check reads what it leaves out
    found = {path.rstrip("/") or "/" for path in located if not path.startswith(PROXY_OWN)}
    for alternatives in re.findall(r"^\s*location ~ \^/\(([a-z|]+)\)\$ \{", conf, re.MULTILINE):
        found |= {f"/{name}" for name in alternatives.split("|")}
    for manifest in sorted((ROOT / "deploy" / "kubernetes" / "base").glob("ingress*.yaml")):
        ingress = yaml.safe_load(manifest.read_text())
        found |= {path["path"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]}
    return found


def test_the_proxies_name_only_places_of_the_url_table() -> None:
    from gateway.http.urls import PLACES

    places = {place.path for place in PLACES}
    named = proxy_paths()
    assert {"/auth", "/login", "/neuroglancer", "/data", "/"} <= named  # the check reads what it looks for
    assert not named - places - set(CREDENTIAL_PREFIXES), f"not in the URL table: {sorted(named - places)}"


# One dispatcher, no hidden state: no layer of the edge hands another a request's state through the ASGI scope (each
# reads what it needs from the request itself), and the app's request tally is the app's, not the process's.
def scope_writes(path: Path) -> list[str]:
    """The keys ``path`` stores into a mapping named ``scope`` (``scope[KEY] = ...``, ``scope.setdefault(KEY...``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == "scope":
                found.append(f"line {target.lineno}: scope[{ast.unparse(target.slice)}]")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("setdefault", "update")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "scope"
        ):
            found.append(f"line {node.lineno}: scope.{node.func.attr}")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "gateway").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_layer_smuggles_state_in_the_scope(path: Path) -> None:
    assert not scope_writes(path), f"{path.relative_to(ROOT)} writes into the scope: {scope_writes(path)}"


def test_the_scope_check_sees_a_planted_write(tmp_path: Path) -> None:
    planted = tmp_path / "bad.py"
    planted.write_text("def f(scope):\n    scope['gateway.exchange'] = 1\n    scope.setdefault('x', 2)\n")
    assert len(scope_writes(planted)) == 2


def test_the_request_tally_is_the_apps() -> None:
    from gateway import metrics

    tallies = [name for name, value in vars(metrics).items() if isinstance(value, metrics.RequestStats)]
    assert not tallies, f"process-global request tallies in gateway/metrics.py: {tallies}"
