"""Torch and transformers (the test extra's references) stay optional: no test module imports them
at module level, itself or through a module of this repository it imports at module level
(`support.*`, `sampling.*`, a sibling test module). A test that needs them reads them through
`support.optional` (`from support.optional import torch, transformers`, `lazy(...)` for a module
that imports torch): without the test extra only the tests that use them skip and the rest of
their module runs. An import inside a function, or under `if TYPE_CHECKING:`, is lazy. The package
itself (`jaxdllm`) imports without torch: every test imports it."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
HEAVY = ("torch", "transformers", "safetensors.torch")  # safetensors.torch imports torch


def _tree(path: Path) -> ast.Module:
    return _parse(path.read_text(), str(path))


@functools.cache
def _parse(text: str, name: str) -> ast.Module:
    return ast.parse(text, name)


@functools.cache
def _local_file(module: str, importer: Path) -> Path | None:
    """The test-side file of a dotted module name, or None (a third-party module, or the package).
    Test modules import their siblings by bare name (`from test_jacobi import ...`: pytest puts
    their folder on the path)."""
    parts = module.split(".")
    if parts[0] == "jaxdllm":
        return None
    base = {"support": TESTS, "sampling": ROOT}.get(parts[0], importer.parent)
    path = base.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file() and candidate != importer:
            return candidate
    return None


def _top_level_imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import that runs when `path` is imported: module level, also inside
    `if`/`try`/`with` blocks, not inside functions or classes' methods, not under TYPE_CHECKING."""
    found = []

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((node.module, node.lineno))
                # `from support import hf_models` imports the submodule
                found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names
                             if _local_file(f"{node.module}.{alias.name}", path))
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body), visit(node.orelse), visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.With):
                visit(node.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(_tree(path).body)
    return found


def _heavy(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in HEAVY)


def _heavy_chain(path: Path, seen: dict[Path, list[str] | None]) -> list[str] | None:
    """The import chain from `path` to torch or transformers at import time, or None."""
    if path in seen:
        return seen[path]
    seen[path] = None  # an import cycle ends here
    for module, line in _top_level_imports(path):
        here = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line} imports {module}"
        if _heavy(module):
            seen[path] = [here]
            return seen[path]
        local = _local_file(module, path)
        if local is not None:
            rest = _heavy_chain(local, seen)
            if rest is not None:
                seen[path] = [here, *rest]
                return seen[path]
    return None


def _stand_ins_read_at_import(path: Path) -> list[str]:
    """Where `path` reads a `support.optional` stand-in (`torch`, `transformers`, a `lazy(...)`
    module) or calls `require` while it is imported (module level, class bodies, decorators,
    default values): without the extra that read skips every test of the module."""
    tree = _tree(path)
    names, calls, future = set(), set(), False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "support.optional":
            names |= {alias.asname or alias.name for alias in node.names if alias.name != "lazy"}
            calls = {alias.asname or alias.name for alias in node.names if alias.name == "require"}
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future |= any(alias.name == "annotations" for alias in node.names)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Name) and node.value.func.id == "lazy"):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    found = []

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # the body runs when called; decorators, defaults (and annotations without
            # `from __future__ import annotations`) run now
            now = [*getattr(node, "decorator_list", []), *node.args.defaults,
                   *(d for d in node.args.kw_defaults if d is not None)]
            if not future and not isinstance(node, ast.Lambda):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                        node.args.vararg, node.args.kwarg]
                now += [a.annotation for a in args if a is not None and a.annotation is not None]
                now += [node.returns] if node.returns else []
            for child in now:
                visit(child)
            return
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
            found.append(f"{where} reads {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in calls:
            found.append(f"{where} calls {node.func.id}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in tree.body:
        visit(node)
    return found


def test_no_test_module_imports_torch_or_transformers_at_top_level():
    """Nor reads them (through `support.optional`) while it is imported."""
    seen: dict[Path, list[str] | None] = {}
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path.is_relative_to(TESTS / "support"):
            continue  # checked where a test module imports it at its top
        chain = _heavy_chain(path, seen)
        if chain is not None:
            offenders[str(path.relative_to(ROOT))] = " -> ".join(chain)
    reads = [line for path in sorted(TESTS.rglob("*.py")) if path.name != "optional.py"
             for line in _stand_ins_read_at_import(path)]
    assert not reads, ("these read torch or transformers while their module is imported, so without the test "
                       "extra the whole module skips; read them inside the test or fixture:\n  "
                       + "\n  ".join(reads))
    assert not offenders, (
        "these test modules import torch or transformers when they are imported, so without the test "
        "extra every test in them skips; read them through support.optional instead "
        "(`from support.optional import torch, transformers`, `lazy(\"sampling.torch_reference...\")`):\n"
        + "\n".join(f"  {name}: {chain}" for name, chain in offenders.items()))


def test_the_scan_follows_imported_modules_and_leaves_function_imports_alone(tmp_path):
    (tmp_path / "helper.py").write_text("import json\n\ntry:\n    from transformers import AutoConfig\n"
                                        "except ImportError:\n    pass\n")
    module = tmp_path / "test_example.py"
    module.write_text("import numpy\nfrom support import optional\nfrom helper import AutoConfig\n")
    chain = _heavy_chain(module, {})
    assert chain is not None and "helper" in chain[0] and chain[-1].endswith("imports transformers"), chain
    module.write_text("import numpy\nfrom support.optional import torch\n\n\ndef test_x():\n"
                      "    import transformers\n    from helper import AutoConfig\n")
    assert _heavy_chain(module, {}) is None


def test_the_scan_sees_a_stand_in_read_at_import(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text("import pytest\nfrom support.optional import lazy, require, torch\n\nport = lazy('x')\n\n\n"
                      "@pytest.mark.parametrize('dtype', [torch.float32])\ndef test_x(dtype, f=port.g):\n"
                      "    torch.ones(3)\n    require('torch')\n\n\n"
                      "class TestY:\n    DTYPE = require('torch').bfloat16\n")
    assert [line.rsplit(":", 1)[1] for line in _stand_ins_read_at_import(module)] == [
        "7 reads torch.float32", "8 reads port.g", "14 calls require"]
