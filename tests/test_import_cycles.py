"""No import cycles inside the `jaxdllm` package, and the layers README's Architecture section
names: a module imports only from its own layer or the ones before it. Every `import` of a
jaxdllm module, at module level or inside a function, is an edge; `from package import name`
counts as an edge to the submodule `package.name` when that is a module (the package's
`__init__` re-exporting its own submodules is not a cycle), else to the package."""

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxdllm"
# README's Architecture section, first paragraph: each layer imports only from itself and earlier ones.
LAYERS = [["errors", "validation", "shipped", "extras", "output_paths", "distributed", "interrupts", "compilation_cache",
           "sharding", "attention", "launch"],
          ["models", "registry"],
          ["checkpoint", "tokenizer", "decoding", "data"],
          ["pretrained", "memory_plan", "flops"],
          ["train", "eval", "serving", "molecules"],
          ["lowering", "cli"]]


def _modules(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {name: set() for name in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.split(".")[0] == "jaxdllm"]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
                if base.split(".")[0] != "jaxdllm":
                    continue
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else owner(base) for a in node.names]
            else:
                continue
            edges[name].update(t for t in targets if t and t != name)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "jaxdllm"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from jaxdllm.sub import a\n")  # re-export: no cycle
    (package / "sub" / "a.py").write_text("from . import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from jaxdllm.c import g\n")
    (package / "c.py").write_text("import jaxdllm.sub.a\n")
    assert _cycles(_import_graph(_modules(package))) == [["jaxdllm.c", "jaxdllm.sub.a", "jaxdllm.sub.b"]]


def test_jaxdllm_has_no_import_cycles():
    modules = _modules(PACKAGE)
    assert len(modules) > 50
    assert _cycles(_import_graph(modules)) == []


def test_each_layer_imports_only_from_itself_and_earlier_layers():
    modules = _modules(PACKAGE)
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    top = {m: m.split(".")[1] for m in modules if m != "jaxdllm"}
    assert set(top.values()) == set(rank), "a top-level module or package is missing from LAYERS (and README)"
    upward = sorted((m, t) for m, targets in _import_graph(modules).items() if m in top
                    for t in targets if t in top and rank[top[t]] > rank[top[m]])
    assert not upward, f"imports from a later layer: {upward}"
    readme = (PACKAGE.parent / "README.md").read_text().split("## Architecture", 1)[1].split("\n\n", 2)[1]
    assert " ← ".join(", ".join(f"`{n}`" for n in layer) for layer in LAYERS) in " ".join(readme.split())
