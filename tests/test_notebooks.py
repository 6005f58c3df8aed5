"""Every notebook in colab/ runs top to bottom at its small size (CPU, no network) with nbclient,
from colab/ (where Jupyter starts a notebook);
its saved copy with outputs has no error cell. The training notebooks run their
cells at a test size (`JAXDLLM_NOTEBOOK_SIZE=test`: fewer teacher answers, steps and eval prompts;
the same commands, files and plot)."""

import json
import re
from pathlib import Path

import jax
import pytest

pytest.importorskip("nbclient", reason="the notebooks extra: pip install -e '.[notebooks]'")
pytest.importorskip("jupytext", reason="the notebooks extra: pip install -e '.[notebooks]'")

from colab.run_notebooks import COLAB, execute, notebook_sources  # noqa: E402

SOURCES = notebook_sources()


def test_every_notebook_has_a_saved_copy_without_errors():
    assert [p.stem for p in SOURCES] == sorted(p.stem for p in COLAB.glob("[0-9][0-9]_*.ipynb"))
    for source in SOURCES:
        cells = json.loads(source.with_suffix(".ipynb").read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert code and all(c.get("execution_count") for c in code), f"{source.stem}: not executed"
        outputs = [o for c in code for o in c["outputs"]]
        assert not [o for o in outputs if o["output_type"] == "error"], source.stem
        assert "colab-badge.svg" in "".join(cells[0]["source"]), f"{source.stem}: no Colab badge"


def test_notebooks_name_no_root_relative_path():
    """Paths such as `checkpoints/...` or `training/...` work only from the repository root: the
    notebooks load shipped models and recipes by name (`jaxdllm.load`, `recipe_path`)."""
    code_lines = [line for source in SOURCES for line in source.read_text().splitlines() if not line.startswith("#")]
    assert not [line for line in code_lines if re.search(r"(?<!/ )[\"'](checkpoints|training|sampling)/", line)]


# Every notebook runs once from colab/ (where Jupyter and Colab start them). Working-folder independence
# is checked for every notebook above (no root-relative path; shipped models and recipes by name).
TRAINING = {"03_certainty_forcing", "04_jacobi_forcing"}
# notebooks whose time is executing (training steps, thousands of molecule forwards), not compiling
EXECUTING = TRAINING | {"07_genmol"}
@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=[f"{s.stem}-from-colab" for s in SOURCES])
def test_notebook_runs_top_to_bottom(source, tmp_path, monkeypatch):
    # The notebooks turn on the persistent compilation cache (`jaxdllm.enable_compilation_cache()`); here
    # it is the test processes' folder, so a notebook's second run (a user's next session) can load the
    # programs its first run compiled, as a user's second session does.
    # The training notebooks' test size (colab/03, colab/04: the parameters cell reads it); the others
    # have no size of their own below the CPU one and ignore it.
    monkeypatch.setenv("JAXDLLM_NOTEBOOK_SIZE", "test")
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        monkeypatch.setenv("JAXDLLM_COMPILATION_CACHE", str(Path(cache) / "notebooks"))
    if source.stem in EXECUTING:
        # A training (or molecule-sampling) notebook's kernel (and the commands it starts) runs as a user's
        # does, like the command-line tests' children (tests/support/cli.py): without this process's XLA_FLAGS. Those
        # (8 fake devices, XLA's CPU optimisations turned down: tests/conftest.py) make its training
        # steps and evaluations twice as slow, and GenMol's remasking loop four times. The other notebooks' time is compiling, which the
        # turned-down optimisations shorten: they keep the flags.
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    target, seconds = execute(source, tmp_path, cwd=COLAB)  # raises CellExecutionError on any failing cell
    cells = json.loads(target.read_text())["cells"]
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
    assert any(o["output_type"] == "display_data" for o in outputs), "no plot"
