"""Execute the notebooks of `colab/` from their jupytext sources and save them with outputs.

    python colab/run_notebooks.py               # every notebook, outputs into colab/*.ipynb
    python colab/run_notebooks.py 01 --out DIR  # those whose name starts with 01, into DIR

The `.py` files (jupytext percent format) are the sources; the `.ipynb` files are written from
them with their outputs, so GitHub shows the results. Each notebook runs from the repository
root (`--cwd colab` runs them where Jupyter starts them), at its small size when JAX has no
accelerator. Needs `pip install -e ".[notebooks]"`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

COLAB = Path(__file__).resolve().parent
ROOT = COLAB.parent


def notebook_sources(prefixes: list[str] | None = None) -> list[Path]:
    """`colab/NN_*.py` in order, optionally only those whose name starts with one of `prefixes`."""
    sources = sorted(p for p in COLAB.glob("[0-9][0-9]_*.py"))
    return [p for p in sources if not prefixes or any(p.name.startswith(x) for x in prefixes)]


def execute(source: Path, out_dir: Path, timeout: int = 1200, cwd: Path = ROOT) -> tuple[Path, float]:
    """Run `source` top to bottom in a fresh kernel started in `cwd`; write `<out_dir>/<name>.ipynb`.
    Raises on a cell error."""
    from jaxdllm.extras import require

    for module in ("jupytext", "nbformat", "nbclient"):
        require(module, "notebooks", "running the notebooks")
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    notebook = jupytext.read(source)
    start = time.perf_counter()
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    seconds = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{source.stem}.ipynb"
    nbformat.write(notebook, target)
    return target, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefixes", nargs="*", help="run only notebooks whose name starts with one of these")
    parser.add_argument("--out", type=Path, default=COLAB, help="where the executed .ipynb files go")
    parser.add_argument("--cwd", type=Path, default=ROOT, help="the kernel's working folder (default: the repository root)")
    args = parser.parse_args(argv)
    from jaxdllm.extras import exit_if_missing

    exit_if_missing(("jupytext", "nbformat", "nbclient"), "notebooks", "colab/run_notebooks.py")
    for source in notebook_sources(args.prefixes):
        target, seconds = execute(source, args.out, cwd=args.cwd.resolve())
        print(f"{source.name}: {seconds:.0f} s -> {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
