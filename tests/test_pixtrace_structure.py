"""PixTrace's modules: no module imports another's private name, and their imports form no cycle
(function-level imports included)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "copynce_hf"
SCOPE = PACKAGE / "pixtrace"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, list[tuple[str, str]]]:
    """module -> [(imported module, imported name)] for every ``from ... import`` inside copynce_hf."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    found = {}
    for name, path in modules.items():
        if not path.is_relative_to(SCOPE):
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found[name] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("copynce_hf"):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                found[name].append((target, alias.name))
    return found


def test_no_private_names_cross_modules():
    crossings = [(module, target, name) for module, imports in _imports().items() for target, name in imports
                 if name.startswith("_") and not name.startswith("__") and target != module]
    assert crossings == []


def test_no_import_cycles():
    graph = {module: {target for target, _ in imports} for module, imports in _imports().items()}

    def reaches(start, goal, seen):
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(module for module in graph if reaches(module, module, {module}))
    assert cycles == []
