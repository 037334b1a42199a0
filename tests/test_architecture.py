"""The package's structure, checked from its source: import direction, the database
boundary, and constants written once (docs/development.md, "Import direction").

The import checks parse every module with ``ast`` (nothing is imported), so they see
imports inside functions and under ``TYPE_CHECKING`` too, and they name the file, line
and rule of every offending import.
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import django_tasks_plus

PACKAGE = "django_tasks_plus"
ROOT = Path(django_tasks_plus.__file__).parent

# Top to bottom: a module may import modules of its own layer and of the layers below it,
# never above. A module is in the layer of its longest listed prefix. A new top-level
# module must be added here (and to docs/development.md).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "entry points",
        (PACKAGE, "admin", "apps", "checks", "management", "urls", "views"),
    ),
    ("worker", ("worker", "schedules.service", "schedules.feature")),
    (
        "backend and app API",
        (
            "backend",
            "operations",
            "context",
            "circuits",
            "selection",
            "search",
            "metrics",
            "schedules",
        ),
    ),
    ("enqueue and results", ("envelope", "results", "finished", "signalbatch")),
    (
        "definitions, settings and seams",
        ("definition", "conf", "discovery", "events", "middleware"),
    ),
    ("database boundary", ("db",)),
    ("tables", ("models",)),
    (
        "pure",
        (
            "lifecycle",
            "retry",
            "schema",
            "typehints",
            "binding",
            "doers",
            "codec",
            "stored",
            "limits",
            "breaker",
            "charts",
            "durations",
            "metadata",
            "liveness",
            "waiting",
            "extensions",
            "collector",
            "schedules.timing",
            "schedules.errors",
            "schedules.words",
        ),
    ),
    ("foundation", ("compat", "exceptions", "timebounds", "registries")),
]
PURE = "pure"
MIGRATIONS = f"{PACKAGE}.migrations"


def _layer_of() -> dict[str, tuple[int, str]]:
    table = {}
    for index, (name, members) in enumerate(LAYERS):
        for member in members:
            table[member if member == PACKAGE else f"{PACKAGE}.{member}"] = (index, name)
    return table


LAYER_OF = _layer_of()


def module_name(path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package (migrations aside), by dotted name."""
    found = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}
    return {name: path for name, path in found.items() if not name.startswith(MIGRATIONS)}


def layer(module: str) -> tuple[int, str] | None:
    """The layer of ``module``: that of its longest listed prefix."""
    candidate = module
    while candidate.startswith(f"{PACKAGE}.") or candidate == module:
        if candidate in LAYER_OF:
            return LAYER_OF[candidate]
        candidate = candidate.rpartition(".")[0]
    return None


def imports(module: str, source: str, known: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for each import of a package module in ``source``.

    Relative imports are resolved against ``module``; ``from x import y`` counts as an
    import of ``x.y`` when that is a module, else of ``x``.
    """
    is_package = module == PACKAGE or f"{module}.__init__" in known
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((node.lineno, submodule if submodule in known else target))
    return [
        (line, name) for line, name in found if name == PACKAGE or name.startswith(f"{PACKAGE}.")
    ]


def violations(module: str, source: str, known: set[str]) -> list[str]:
    """What is wrong with the imports of ``module``, one line per offending import."""
    own = layer(module)
    if own is None:
        return [f"{module} is in no layer: add it to LAYERS in {__name__} and to the docs"]
    problems = []
    for line, target in imports(module, source, known):
        theirs = layer(target)
        if theirs is None:
            problems.append(f"{module}:{line} imports {target}, which is in no layer")
        elif theirs[0] < own[0]:
            problems.append(
                f"{module}:{line} imports {target}: the {own[1]!r} layer must not import "
                f"the higher {theirs[1]!r} layer"
            )
    if own[1] == PURE:
        for node in ast.walk(ast.parse(source)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                if name == "django.db" or name.startswith("django.db."):
                    problems.append(
                        f"{module}:{node.lineno} imports {name}: pure modules do no I/O"
                    )
    return problems


def _known_with_packages(modules: dict[str, Path]) -> set[str]:
    known = set(modules)
    known |= {f"{name}.__init__" for name, path in modules.items() if path.name == "__init__.py"}
    return known


def test_imports_point_down_the_layers():
    modules = package_modules()
    known = _known_with_packages(modules)
    problems = []
    for name, path in modules.items():
        problems += violations(name, path.read_text(), known)
    assert not problems, "Imports against the allowed direction:\n" + "\n".join(problems)


def test_the_import_check_catches_an_upward_import():
    """The check is not vacuous: the imports this issue removed would fail it."""
    known = _known_with_packages(package_modules())
    conf = violations(f"{PACKAGE}.conf", "from .worker.doers import make_doer\n", known)
    assert conf == [
        f"{PACKAGE}.conf:1 imports {PACKAGE}.worker.doers: the "
        "'definitions, settings and seams' layer must not import the higher 'worker' layer"
    ]
    db = violations(f"{PACKAGE}.db.base", "from ..envelope import JsonText\n", known)
    assert len(db) == 1 and "must not import the higher 'enqueue and results'" in db[0]
    lazy = violations(f"{PACKAGE}.codec", "def f():\n    from django.db import connection\n", known)
    assert lazy == [f"{PACKAGE}.codec:2 imports django.db: pure modules do no I/O"]
    unknown = violations(f"{PACKAGE}.newthing", "", known)
    assert unknown and "is in no layer" in unknown[0]


def _vendor_tests(source: str) -> list[int]:
    """Lines that compare or look up ``<something>.vendor``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(op, ast.Attribute) and op.attr == "vendor" for op in operands):
                lines.append(node.lineno)
    return lines


def test_only_the_dialect_registry_branches_on_the_database_vendor():
    """Everything that differs by database is a ``Dialect`` method or fragment: the one
    ``connection.vendor`` test is ``dialect_for``'s."""
    allowed = {f"{PACKAGE}.db"}
    problems = [
        f"{path.relative_to(ROOT.parent)}:{line} branches on .vendor: make it a Dialect "
        "method or fragment (django_tasks_plus/db/base.py)"
        for name, path in package_modules().items()
        if name not in allowed
        for line in _vendor_tests(path.read_text())
    ]
    assert not problems, "\n".join(problems)


def test_limits_are_defined_only_in_limits_py():
    """``*_MAX_LENGTH`` constants are assigned once, in ``limits.py``; models and
    validators import them."""
    problems = []
    for name, path in package_modules().items():
        if name == f"{PACKAGE}.limits":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id.endswith("_MAX_LENGTH"):
                    problems.append(f"{name}:{node.lineno} defines {target.id}")
    assert not problems, "Define these in django_tasks_plus/limits.py:\n" + "\n".join(problems)


def test_models_use_the_shared_limits():
    from django_tasks_plus import limits
    from django_tasks_plus.models import DedupKey, TaskRecord, WorkerRecord

    assert TaskRecord._meta.get_field("task_path").max_length == limits.TASK_PATH_MAX_LENGTH
    assert TaskRecord._meta.get_field("queue_name").max_length == limits.QUEUE_NAME_MAX_LENGTH
    assert TaskRecord._meta.get_field("ordering_key").max_length == limits.KEY_MAX_LENGTH
    assert DedupKey._meta.get_field("key").max_length == limits.KEY_MAX_LENGTH
    assert WorkerRecord._meta.get_field("worker_id").max_length == limits.WORKER_ID_MAX_LENGTH


def test_the_sql_names_are_the_models_names():
    """``db/sql.py`` and the dialects write table, column and status names as literals:
    they must be what the models create."""
    from django_tasks_plus.compat import TaskResultStatus
    from django_tasks_plus.db import sql
    from django_tasks_plus.models import DedupKey, TaskRecord

    assert TaskRecord._meta.db_table == sql.TASKS
    assert DedupKey._meta.db_table == sql.DEDUP_KEYS
    for model in (TaskRecord, DedupKey):
        renamed = [f.name for f in model._meta.concrete_fields if f.column != f.name]
        assert not renamed, f"{model.__name__} fields with a db_column: {renamed}"
    assert set(sql.CLAIM_COLUMNS) <= {f.name for f in TaskRecord._meta.concrete_fields}
    for status in ("READY", "RUNNING", "FAILED"):
        assert TaskResultStatus[status].value == status


def test_every_setting_default_is_written_once():
    """``BackendSettings``' field defaults are what an empty ``OPTIONS`` parses to."""
    from django_tasks_plus.conf import BackendSettings, parse_settings

    parsed = parse_settings("alias", {"QUEUES": ["default"]})
    bare = BackendSettings(alias="alias", queues=frozenset({"default"}))
    for f in fields(BackendSettings):
        if f.name != "queue_order":  # from QUEUES, not OPTIONS
            assert getattr(bare, f.name) == getattr(parsed, f.name), f.name


# The engine: what every task goes through, whatever features a project uses.
ENGINE = (
    "worker.engine",
    "worker.execution",
    "worker.reporter",
    "backend",
    "envelope",
    "db.sql",
    "db.base",
    "db.postgresql",
    "db.sqlite",
    "db.completions",
    "db.store",
)
# Features: they plug into the engine (extensions.py, events, middleware, services) and
# the engine never names them. A new feature module (schedules, rate limits…) goes here.
FEATURES = (
    "breaker",
    "circuits",
    "metrics",
    "db.breakers",
    "db.metrics",
    "worker.metrics_flusher",
    "worker.pruner",
    "db.retention",
    "schedules",
    "worker.scheduler",
)
# Known paths from the engine to a feature, each with why it is still there. The test
# fails once a path is gone, so the entry is removed with the debt.
ENGINE_FEATURE_DEBTS = {
    (f"{PACKAGE}.definition", f"{PACKAGE}.breaker"): (
        "the Task's breaker= option and its key, computed in enqueue's build step "
        "(definition.CallRules); to become a breaker enqueue middleware writing the key "
        "(enqueue middleware exists now; the key still needs its own column for the index)"
    ),
}


def _is_feature(module: str) -> bool:
    short = module.removeprefix(f"{PACKAGE}.")
    return any(short == name or short.startswith(f"{name}.") for name in FEATURES)


def _import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    known = _known_with_packages(modules)
    return {
        name: {target for _, target in imports(name, path.read_text(), known) if target in modules}
        for name, path in modules.items()
    }


def engine_feature_paths(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Each import edge into a feature module that an engine module reaches (directly or
    through other modules), with the chain of modules that leads to it."""
    found: dict[tuple[str, str], list[str]] = {}
    for engine in ENGINE:
        start = f"{PACKAGE}.{engine}"
        chain: dict[str, list[str]] = {start: [start]}
        stack = [start]
        while stack:
            module = stack.pop()
            for target in sorted(graph.get(module, ())):
                if _is_feature(target):
                    found.setdefault((module, target), chain[module] + [target])
                    continue  # a feature's own imports are its business
                if target not in chain:
                    chain[target] = chain[module] + [target]
                    stack.append(target)
    return found


def test_the_engine_imports_no_feature_module():
    """The worker's engine, execution and reporter, the backend's enqueue path and db/'s
    claim and outcome statements never import a feature (breakers, metrics, schedules…),
    not even through another module: features plug in through the extension points."""
    paths = engine_feature_paths(_import_graph())
    problems = [
        " -> ".join(chain) for edge, chain in paths.items() if edge not in ENGINE_FEATURE_DEBTS
    ]
    assert not problems, "The engine reaches feature modules:\n" + "\n".join(problems)
    stale = [f"{a} -> {b}" for a, b in ENGINE_FEATURE_DEBTS if (a, b) not in paths]
    assert not stale, "Paid debts: remove from ENGINE_FEATURE_DEBTS:\n" + "\n".join(stale)


def test_the_engine_rule_catches_a_feature_import():
    graph = _import_graph()
    graph[f"{PACKAGE}.db.completions"] = {f"{PACKAGE}.metrics.aggregate"}
    graph[f"{PACKAGE}.worker.engine"] = {f"{PACKAGE}.worker.metrics_flusher"}
    paths = engine_feature_paths(graph)
    assert (f"{PACKAGE}.db.completions", f"{PACKAGE}.metrics.aggregate") in paths
    assert paths[(f"{PACKAGE}.worker.engine", f"{PACKAGE}.worker.metrics_flusher")] == [
        f"{PACKAGE}.worker.engine",
        f"{PACKAGE}.worker.metrics_flusher",
    ]
