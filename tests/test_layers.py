"""The shape of the code (issue 34): the app's top level (main.py, flow.py, the nodes) uses the package, never
the reverse; utils/ are leaf helpers; each part of the package (a folder, or a module of its own folder)
imports only parts below it, in no circle; no source file (the app's, or a benchmark's) over 400 lines, no
class over 250.

What still breaks these rules lives in files other work holds now: it is listed below, each entry by
name, so that the rules hold for everything else and the lead removes an entry when it is fixed."""

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

TOP = {"main", "flow", "nodes", "indexing_nodes", "research_nodes", "memory_nodes"}
PLAIN_TYPES = {"records", "errors"}  # what utils/ may use of the package
# The package's parts, lowest first: a part imports only parts of lower layers (and its own modules).
LAYERS = [
    ["settings", "errors", "records", "background", "hashes"],
    ["jobs", "flows", "limits", "providers", "protocol", "steps", "versions", "export", "metrics"],
    ["turn_log", "store"],
    ["search", "shares", "transfer", "tools", "documents", "accounts"],
    ["images", "paths"],
    ["conversations"],
    ["cluster", "presses"],
    ["state"],
    ["turns"],
    ["web"],
]
# The store imports the features' own types (search's SearchHit and SearchQuery, and the
# transfer's ConversationTree): those types move below the store with the store's next change.
NOT_YET_ONE_WAY = {
    "pocketchat.paths imports pocketchat.conversations",  # for its types: see NOT_YET_WITHOUT_CIRCLES
    "pocketchat.store imports pocketchat.search",
    "pocketchat.store imports pocketchat.transfer",
    "pocketchat.store.postgres_search imports pocketchat.search",
    "pocketchat.store.postgres_transfer imports pocketchat.transfer",
    "pocketchat.store.sqlite_search imports pocketchat.search",
    "pocketchat.store.sqlite_transfer imports pocketchat.transfer",
    "pocketchat.store.transfer imports pocketchat.transfer",
}
# The store's backends take a helper (TOMBSTONE_SECONDS) from the store's __init__, which opens them.
# paths.py names Conversation and Hub in its types (TYPE_CHECKING) while conversations.py uses Paths.
NOT_YET_WITHOUT_CIRCLES = {
    "pocketchat.conversations -> pocketchat.paths -> pocketchat.conversations",
    "pocketchat.store -> pocketchat.store.postgres -> pocketchat.store",
    "pocketchat.store -> pocketchat.store.sqlite -> pocketchat.store",
}
# nodes.py grew again with NameConversation; PostgresStore and Imports with the database's claims and paths.
NOT_YET_SMALL = {
    "pocketchat/store/sqlite_schema.py: over 400 lines",  # a list of 18 migration steps, each one SQL script
    "nodes.py: over 400 lines",
    "pocketchat/store/postgres.py: class PostgresStore over 250 lines",
    "pocketchat/transfer/imports.py: class Imports over 250 lines",
    "pocketchat/conversations.py: over 400 lines",
    "pocketchat/conversations.py: class Conversation over 250 lines",
    "pocketchat/cluster/replicas.py: class Replicas over 250 lines",
}
MOST_LINES, MOST_CLASS_LINES = 400, 250


def sources() -> list[Path]:
    folders = ["pocketchat", "utils"]
    return [path for folder in folders for path in (ROOT / folder).rglob("*.py")] + [
        ROOT / f"{name}.py" for name in sorted(TOP)
    ]


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The modules `path` imports (at its top, in a function, or for type checking), relative ones
    resolved; for `from x import name`, both `x` and `x.name` (which may be a module)."""
    found = set()
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def part_of(module: str) -> str | None:
    """The part of the package a module is in: `pocketchat.store.sqlite` is "store"."""
    pieces = module.split(".")
    return pieces[1] if pieces[0] == "pocketchat" and len(pieces) > 1 else None


def layer_of(part: str) -> int:
    for number, layer in enumerate(LAYERS):
        if part in layer:
            return number
    raise AssertionError(f"pocketchat.{part} is in no layer of tests/test_layers.py: place it")


def upward_imports() -> set[str]:
    """Each import of a part by a part not above it, as "module imports pocketchat.part"."""
    upward = set()
    for path in (ROOT / "pocketchat").rglob("*.py"):
        module = module_of(path)
        if (here := part_of(module)) is None:
            continue  # the package's own __init__, which imports nothing
        for name in imports_of(path):
            there = part_of(name)
            if there is not None and there != here and layer_of(there) >= layer_of(here):
                upward.add(f"{module} imports pocketchat.{there}")
    return upward


def circles() -> set[str]:
    graph: dict[str, set[str]] = defaultdict(set)
    modules = {module_of(path): path for path in sources()}
    for module, path in modules.items():
        graph[module] = {name for name in imports_of(path) if name in modules and name != module}
    found = set()
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                found.add(" -> ".join([*trail[trail.index(other) :], other]))
            elif other not in state:
                visit(other, [*trail, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def too_long() -> set[str]:
    long = set()
    for path in [*sources(), *(ROOT / "bench").glob("*.py")]:
        name, text = path.relative_to(ROOT).as_posix(), path.read_text()
        if text.count("\n") > MOST_LINES:
            long.add(f"{name}: over {MOST_LINES} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MOST_CLASS_LINES:
                long.add(f"{name}: class {node.name} over {MOST_CLASS_LINES} lines")
    return long


def test_the_package_never_imports_the_apps_top_level_and_utils_use_only_its_plain_types():
    wrong = []
    for path in sources():
        module = module_of(path)
        for name in imports_of(path):
            if module.startswith("pocketchat") and name.split(".")[0] in TOP:
                wrong.append(f"{module} imports {name}")
            if module.startswith("utils") and part_of(name) not in (None, *PLAIN_TYPES):
                wrong.append(f"{module} imports {name}: utils/ may use the package's plain types only")
    assert wrong == []


def test_each_part_of_the_package_imports_only_parts_below_it():
    assert upward_imports() - NOT_YET_ONE_WAY == set()


def test_no_module_imports_itself_through_others():
    assert circles() - NOT_YET_WITHOUT_CIRCLES == set()


def test_no_source_file_over_400_lines_and_no_class_over_250():
    assert too_long() - NOT_YET_SMALL == set()


def test_what_is_left_to_fix_is_still_there():
    """An entry fixed is taken off its list, so that the lists say what is left and nothing comes back."""
    assert upward_imports() >= NOT_YET_ONE_WAY
    assert circles() >= NOT_YET_WITHOUT_CIRCLES
    assert too_long() >= NOT_YET_SMALL
