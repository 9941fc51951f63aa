"""The architecture's figures, checked: import cycles, module sizes, ignores, local imports.

    python scripts/arch_report.py [--no-duplicates]   # print the figures; exit 1 if a limit is broken

Limits (see docs/design.md): no import cycle among idist's modules, counting the imports
inside functions (only TYPE_CHECKING imports are left out); no module over 300 lines;
module docstrings of at most 12 lines; at most 10 ``type: ignore`` in src, each with its
reason after it; at most 10 lines with ``# fmt: skip`` and at most 80 lines naming ``Any``
in src; every function-local import says why on its line; no ``Any`` in the signature of a
backend hook. ``duplicates`` (a tool of the development machine, when it is there) is run
over the tree and its count printed.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
MAX_LINES = 300
MAX_DOC_LINES = 12
MAX_IGNORES = 10
MAX_FMT_SKIPS = 10
MAX_ANY_LINES = 80
HOOKS = {
    "_make_comm",
    "_native_group_comm",
    "_allreduce_tensor",
    "_broadcast_tensor",
    "_barrier",
    "_checkpoint",
    "_stand_by",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that can run: at module level and inside functions, not under TYPE_CHECKING.

    A function-local import still makes one module need another once the function runs, so
    an import cycle through one is a cycle all the same (only postponed).
    """
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                target = _resolve(mod, path.name == "__init__.py", node)
                # ``from pkg import sub`` imports the submodule; ``from pkg import name``, pkg itself
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [target, *subs]
            graph[mod] |= {t for t in targets if t in modules and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def local_imports(tree: ast.Module, lines: list[str]) -> Iterator[tuple[int, bool]]:
    """(line, has a reason comment) of every import inside a function."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node.lineno, "#" in lines[node.lineno - 1]


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def _names_any(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
        try:  # a forward reference: cast("Dataset[Any]", x)
            return any(_is_any(n) for n in ast.walk(ast.parse(node.value, mode="eval")))
        except SyntaxError:
            return False
    return _is_any(node)


def any_lines(tree: ast.Module) -> set[int]:
    """Lines whose code names ``Any`` (annotations, casts, bounds; not imports, comments or prose)."""
    return {node.lineno for node in ast.walk(tree) if _names_any(node)}


def hook_anys(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in HOOKS:
            args = [*node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]
            annotations = [a.annotation for a in args if a is not None and a.annotation is not None]
            if node.returns is not None:
                annotations.append(node.returns)
            if any("Any" in ast.unparse(a) for a in annotations):
                yield node.lineno, node.name


def duplicates() -> str:
    exe = shutil.which("duplicates")
    if exe is None:
        return "duplicates: tool not installed here (skipped)"
    out = subprocess.run([exe, "--most", "200", "--seconds", "60"], cwd=ROOT, capture_output=True, text=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith("D")]
    real = [r for r in rows if "boilerplate" not in r]
    lines = [f"duplicates: {len(real)} pairs outside boilerplate ({len(rows)} in all)"]
    return "\n".join(lines + [f"  {r}" for r in real])


def main() -> int:
    modules = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    problems: list[str] = []
    found = cycles(import_graph(modules))
    print(f"modules: {len(modules)}; import cycles (function-local imports counted): {len(found)}")
    problems += [f"import cycle: {' <-> '.join(c)}" for c in found]
    ignores = fmt_skips = anys = 0
    sizes: list[tuple[int, str]] = []
    for _mod, path in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        rel = path.relative_to(ROOT)
        sizes.append((len(lines), str(rel)))
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines (limit {MAX_LINES})")
        doc = ast.get_docstring(tree, clean=False) or ""
        if len(doc.splitlines()) > MAX_DOC_LINES:
            problems.append(f"{rel}: module docstring of {len(doc.splitlines())} lines (limit {MAX_DOC_LINES})")
        for n, line in enumerate(lines, 1):
            if "# type: ignore" in line:
                ignores += 1
                if "#" not in line.split("# type: ignore", 1)[1]:
                    problems.append(f"{rel}:{n}: type: ignore without its reason")
            fmt_skips += "# fmt: skip" in line
        anys += len(any_lines(tree))
        problems += [
            f"{rel}:{n}: function-local import without a reason" for n, ok in local_imports(tree, lines) if not ok
        ]
        problems += [f"{rel}:{n}: Any in the signature of hook {name}" for n, name in hook_anys(tree)]
    print(f"type: ignore in src: {ignores} (limit {MAX_IGNORES})")
    print(f"lines with '# fmt: skip' in src: {fmt_skips} (limit {MAX_FMT_SKIPS})")
    print(f"lines naming Any in src: {anys} (limit {MAX_ANY_LINES})")
    if ignores > MAX_IGNORES:
        problems.append(f"{ignores} type: ignore in src (limit {MAX_IGNORES})")
    if fmt_skips > MAX_FMT_SKIPS:
        problems.append(
            f"{fmt_skips} lines with '# fmt: skip' in src (limit {MAX_FMT_SKIPS}): let the formatter lay them out"
        )
    if anys > MAX_ANY_LINES:
        problems.append(f"{anys} lines naming Any in src (limit {MAX_ANY_LINES}): type them (object, TypedDict)")
    print("largest modules: " + ", ".join(f"{p} {n}" for n, p in sorted(sizes, reverse=True)[:5]))
    print("duplicates: skipped (--no-duplicates)" if "--no-duplicates" in sys.argv else duplicates())
    for p in problems:
        print(f"FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
