"""The modules of copynce_hf: no module imports another's private name, their imports form no cycle
(function-level and lazy imports included), and no module only re-exports names defined elsewhere
(one import path per name; a package's ``__init__`` is its public face and may gather its modules' names);
scripts hold no library code and the training loop fits one screen.

The checks read the source with ``ast`` (nothing is imported); each is first run on a small package
written here with the fault it must find.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "copynce_hf"


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(root, path): path for path in sorted(root.rglob("*.py"))}


def _imports(root: Path) -> dict[str, list[tuple[str, str]]]:
    """module -> [(imported module, imported name)] for every import of ``root``'s package anywhere in a module
    (top level, functions, ``importlib.import_module`` of a literal or of a package's lazy name map)."""
    modules = _modules(root)
    found = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found[name] = []
        tree = ast.parse(path.read_text(encoding="utf-8"))
        lazy = any(isinstance(node, ast.Attribute) and node.attr == "import_module" for node in ast.walk(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if base != root.name and not base.startswith(root.name + "."):
                    continue
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    found[name].append((target, alias.name))
            elif isinstance(node, ast.Import):
                found[name] += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == root.name]
            elif lazy and isinstance(node, ast.Constant) and isinstance(node.value, str):
                # a module imported by name: "pkg.mod", ".mod" (relative to the package) or "mod" in a name map
                text = node.value
                for candidate in (text, f"{package}.{text.lstrip('.')}"):
                    if candidate in modules and candidate != name:
                        found[name].append((candidate, ""))
                        break
    return found


def private_crossings(root: Path) -> list[tuple[str, str, str]]:
    """(module, imported module, name) for each private name one module takes from another; a private
    module (``_registration``) may be imported inside the package that holds it."""
    modules = _modules(root)
    crossings = []
    for module, imports in _imports(root).items():
        for target, name in imports:
            if not name.startswith("_") or name.startswith("__") or target == module:
                continue
            is_module = target in modules and target.endswith(f".{name}")
            own_private_module = is_module and target.rsplit(".", 1)[0] in (module, module.rsplit(".", 1)[0])
            if not own_private_module:
                crossings.append((module, target, name))
    return crossings


def import_cycles(root: Path) -> list[str]:
    """The modules that reach themselves through imports."""
    graph = {module: {target for target, _ in imports} for module, imports in _imports(root).items()}

    def reaches(start, goal, seen):
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    return sorted(module for module in graph if reaches(module, module, {module}))


def re_exports(root: Path) -> list[tuple[str, str]]:
    """(module, name) for each name a module lists in ``__all__`` without defining it, (module, "") for a
    module whose top level holds nothing but imports (a shim); a package ``__init__`` may list the names of
    its own modules, not those of another package (the names of a lazy package, one with ``__getattr__``, come
    from its name map)."""
    found = []
    for module, path in _modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = path.name == "__init__.py"
        defined, exported, only_imports = set(), [], True
        lazy = package and any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and package:
                parts = module.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                if base == module or base.startswith(module + "."):
                    defined |= {alias.asname or alias.name for alias in node.names}
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {target.id for target in targets if isinstance(target, ast.Name)}
                if names == {"__all__"} and isinstance(node.value, (ast.List, ast.Tuple)):
                    exported = [element.value for element in node.value.elts if isinstance(element, ast.Constant)]
                    continue
                defined |= names
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            only_imports = False
        if only_imports and not package:
            found.append((module, ""))
        if not lazy:  # a lazy package's names come from the modules its name map lists
            found += [(module, name) for name in exported if name not in defined]
    return found


# ---------------------------------------------------------------------------------------------- the checks


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_checks_find_a_crossing_a_cycle_and_a_shim(tmp_path):
    package = _write(tmp_path, {
        "pkg/__init__.py": "from .a import public\nfrom .sub.c import later\n\n__all__ = ['later', 'public']\n",
        "pkg/_private.py": "VALUE = 1\n",
        "pkg/a.py": "from . import _private\nfrom .b import _helper\n\ndef public():\n    return _helper()\n",
        "pkg/b.py": "def _helper():\n    from .sub.c import later\n    return later\n",
        "pkg/sub/__init__.py": "import importlib\n\n_SOURCES = {'later': 'c'}\n\n"
                               "def __getattr__(name):\n    return importlib.import_module(f'.{_SOURCES[name]}', __name__)\n",
        "pkg/sub/c.py": "later = 1\n\ndef loop():\n    from pkg.sub import later\n    return later\n",
        "pkg/shim.py": '"""Old name."""\n\nfrom .a import public\n\n__all__ = ["public"]\n',
        "pkg/facade.py": "from .a import public\n\nNAME = 'x'\n__all__ = ['NAME', 'public']\n",
        "pkg/sub/other.py": "from ..a import public\n\nVALUE = public\n",
        "pkg/sub/deeper/__init__.py": "from ...a import public\nfrom .d import own\n\n__all__ = ['own', 'public']\n",
        "pkg/sub/deeper/d.py": "own = 1\n",
    })
    assert private_crossings(package) == [("pkg.a", "pkg.b", "_helper")]
    assert import_cycles(package) == ["pkg.sub", "pkg.sub.c"]  # through the lazy name map of pkg.sub
    assert re_exports(package) == [("pkg.facade", "public"), ("pkg.shim", ""), ("pkg.shim", "public"),
                                   ("pkg.sub.deeper", "public")]


#: The packages checked: the library, and the benchmark drivers beside it.
ROOTS = [PACKAGE, PACKAGE.parent / "benchmarks"]


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.name)
def test_no_private_names_cross_modules(root):
    assert private_crossings(root) == []


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.name)
def test_no_import_cycles(root):
    assert import_cycles(root) == []


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.name)
def test_no_module_only_re_exports(root):
    assert re_exports(root) == []


def _imported_roots(path: Path) -> set[str]:
    """The top-level names of the absolute imports of one file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found |= {name.split(".")[0] for name in names}
    return found


def test_the_package_imports_neither_scripts_nor_benchmarks():
    """Library code lives in the package; scripts and benchmarks call it, never the reverse."""
    found = [(path.name, root) for path in sorted(PACKAGE.rglob("*.py"))
             for root in _imported_roots(path) & {"scripts", "benchmarks"}]
    found += [(path.name, "scripts") for path in sorted((PACKAGE.parent / "benchmarks").rglob("*.py"))
              if "scripts" in _imported_roots(path)]
    assert found == []


def classes_defined(path: Path) -> list[str]:
    """The classes a file defines anywhere (a script defining one holds library code)."""
    return [node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)]


def function_length(path: Path, name: str) -> int:
    """Lines of the top-level function ``name`` of a file, from ``def`` to its last line."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise LookupError(f"{path} defines no top-level function {name!r}")


def test_the_size_checks_measure_what_they_name(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text("class Helper:\n    pass\n\n\ndef main():\n    x = 1\n\n    return x\n", encoding="utf-8")
    assert classes_defined(script) == ["Helper"] and function_length(script, "main") == 4
    with pytest.raises(LookupError, match="'train'"):
        function_length(script, "train")


def test_scripts_are_thin_entry_points():
    """Scripts parse options and call the package: no script defines a type (those live in ``copynce_hf``)."""
    scripts = sorted((PACKAGE.parent / "scripts").glob("*.py"))
    assert scripts and {path.name: classes_defined(path) for path in scripts if classes_defined(path)} == {}


def test_the_training_loop_fits_one_screen():
    """``training/run.py``'s ``train`` reads top to bottom on one screen (DINOv2's ``do_train`` is ~80 lines)."""
    assert function_length(PACKAGE / "training" / "run.py", "train") <= 60


#: The stages ``detect`` and ``dedup`` pass through, lowest first, from the models' runtime through retrieval's stages
#: (its facade after them: it gathers them all) up to the runs and the commands: a module of one stage imports no
#: module of a later one. A tuple is one stage of several modules; the last holds the entry points that call the rest
#: (the command line, the demo, training, the export of trained models). Modules outside every stage (modeling,
#: pixtrace, images, outputs, ...) are below them all.
STAGES = (
    "copynce_hf.runtime",
    ("copynce_hf.retrieval.sources", "copynce_hf.retrieval.work_folder", "copynce_hf.retrieval.predictions",
     "copynce_hf.retrieval.presets"),
    "copynce_hf.retrieval.descriptors",
    "copynce_hf.retrieval.search",
    "copynce_hf.retrieval.content",
    "copynce_hf.retrieval.verify",
    "copynce_hf.retrieval.detection",
    "copynce_hf.retrieval.deduplication",
    "copynce_hf.retrieval",
    "copynce_hf.reports",
    "copynce_hf.evaluation",
    "copynce_hf.calibration",
    "copynce_hf.runs",
    "copynce_hf.commands",
    ("copynce_hf.cli", "copynce_hf.demo", "copynce_hf.training", "copynce_hf.export"),
)


def stage_of(module: str, stages) -> int | None:
    """The index in ``stages`` of the stage that holds ``module`` (the longest matching name; ``None``: none)."""
    found, length = None, -1
    for index, stage in enumerate(stages):
        for name in (stage if isinstance(stage, tuple) else (stage,)):
            if (module == name or module.startswith(name + ".")) and len(name) > length:
                found, length = index, len(name)
    return found


def later_stage_imports(root: Path, stages) -> list[tuple[str, str]]:
    """(module, imported module) for each import from a module of one stage into a module of a later stage, or from a
    module outside every stage into any staged module. A facade (a lazy package) is a stage after every module it
    gathers, so a gathered module that imports the facade imports a later stage."""
    found = []
    for module, imports in _imports(root).items():
        own = stage_of(module, stages)
        for target, _ in imports:
            target_stage = stage_of(target, stages)
            if target_stage is not None and (own if own is not None else -1) < target_stage:
                found.append((module, target))
    return sorted(set(found))


def test_the_stage_check_finds_a_later_import_a_facade_and_an_unstaged_import(tmp_path):
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/base.py": "def helper():\n    from pkg.r.high import g\n    return g\n",
        "pkg/r/__init__.py": "import importlib\n\n_SOURCES = {'f': 'low', 'g': 'high'}\n\n"
                             "def __getattr__(name):\n    return importlib.import_module(f'.{_SOURCES[name]}', __name__)\n",
        "pkg/r/low.py": "def f():\n    from pkg.r import g\n    return g\n",
        "pkg/r/high.py": "from .low import f\n\ndef g():\n    return f\n",
        "pkg/run.py": "from .r.high import g\n",
    })
    stages = ("pkg.r.low", "pkg.r.high", "pkg.r", "pkg.run")
    assert stage_of("pkg.r.high", stages) == 1 and stage_of("pkg.r", stages) == 2 and stage_of("pkg.base", stages) is None
    assert later_stage_imports(package, stages) == [("pkg.base", "pkg.r.high"), ("pkg.r.low", "pkg.r")]


def test_every_retrieval_module_belongs_to_a_stage():
    unstaged = [module for module in _modules(PACKAGE) if module.startswith("copynce_hf.retrieval.")
                and stage_of(module, STAGES) == STAGES.index("copynce_hf.retrieval")]
    assert unstaged == []


def test_detect_and_dedup_import_only_earlier_stages():
    """From ``commands/`` through ``runs/`` into ``retrieval/``'s stages and the runtime, every import goes down."""
    assert later_stage_imports(PACKAGE, STAGES) == []


#: Folders holding model folders, whose ``.py`` files are copies of ``copynce_hf/modeling/`` (``copynce_hf.model_code``
#: keeps them identical): the package's ``pretrained/`` and the benchmarks' ``checkpoints/``.
MODEL_FOLDERS = {"pretrained", "checkpoints"}


def long_functions(root: Path, limit: int) -> list[tuple[str, str, int]]:
    """(file, function, lines) for each function or method of ``root`` longer than ``limit`` lines, decorators
    and argument declarations included (the copies of the model code in :data:`MODEL_FOLDERS` are skipped: they
    are the same files as ``modeling/``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if MODEL_FOLDERS & set(path.relative_to(root).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
                if node.end_lineno - start + 1 > limit:
                    found.append((str(path.relative_to(root)), node.name, node.end_lineno - start + 1))
    return found


def crowded_folders(root: Path, limit: int) -> list[tuple[str, int]]:
    """(folder, modules) for each package folder of ``root`` with more than ``limit`` modules directly in it."""
    found = []
    for folder in sorted([root, *(path for path in root.rglob("*") if path.is_dir())]):
        count = len([path for path in folder.glob("*.py") if path.name != "__init__.py"])
        if count > limit:
            found.append((str(folder.relative_to(root.parent)), count))
    return found


def test_the_length_checks_measure_what_they_name(tmp_path):
    long = "@staticmethod\ndef long(\n    x,\n):\n" + "    x += 1\n" * 3 + "    return x\n"
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": long,
        "pkg/checkpoints/model/copy.py": long,  # a model folder's copy of the model code: skipped
        "pkg/many/__init__.py": "",
        **{f"pkg/many/m{i}.py": "" for i in range(4)},
    })
    assert long_functions(package, 7) == [("a.py", "long", 8)] and long_functions(package, 8) == []
    assert crowded_folders(package, 3) == [("pkg/many", 4)] and crowded_folders(package, 4) == []


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.name)
def test_no_function_is_longer_than_a_screen(root):
    """60 lines at the most, decorators and signature included; a longer one splits into named steps."""
    assert long_functions(root, 60) == []


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.name)
def test_no_folder_holds_more_than_twelve_modules(root):
    """A folder of more than 12 modules splits into subpackages by question or stage."""
    assert crowded_folders(root, 12) == []


def test_the_command_line_is_one_module_per_command():
    """``copynce_hf/commands/`` holds the commands; no ``cli.py`` of hundreds of lines beside it."""
    cli = PACKAGE / "cli.py"
    assert not cli.exists() or len(cli.read_text(encoding="utf-8").splitlines()) < 200
    assert (PACKAGE / "commands").is_dir()
    # each command module declares its subcommand (register) and runs it (run); the shared options live in one module
    shared = {"__init__.py", "options.py", "console.py"}
    commands = sorted(path for path in (PACKAGE / "commands").glob("*.py") if path.name not in shared)
    defined = {path.stem: {node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
                           if isinstance(node, ast.FunctionDef)} for path in commands}
    assert len(commands) == 10 and all({"register", "run"} <= names for names in defined.values()), defined
    # the entry point defines no command of its own (no handler, no option group): it registers them
    entry = {node.name for node in ast.parse(cli.read_text(encoding="utf-8")).body if isinstance(node, ast.FunctionDef)}
    assert entry == {"build_parser", "main"}
