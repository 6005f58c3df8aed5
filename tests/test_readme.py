"""Every Python block of README.md runs, in order, in one fresh process started in an empty folder.

Blocks preceded by `<!-- readme-test: real checkpoint -->` need a real checkpoint: there,
`/models/LLaDA-8B-Instruct` is replaced by a tiny random LLaDA written here (the character
tokenizer with a chat template, max_position 512 so the presets' 256 tokens fit),
`/models/LLaDA2.0-mini` by a tiny random LLaDA2 (MoE) written the same way, and `/tmp/` by a
temporary folder. Every other block runs exactly as written, on the shipped models, from a
folder that is not the repository.
"""

import builtins
import json
import os
import re
import subprocess
import symtable
import sys
from pathlib import Path

import pytest

from flax import nnx

import jaxdllm
from jaxdllm.data import save_char_tokenizer

README = Path(__file__).resolve().parent.parent / "README.md"
REAL = "<!-- readme-test: real checkpoint -->"
BLOCK = re.compile(r"(?P<marker><!-- readme-test: [^>]*-->\n)?```python\n(?P<code>.*?)```", re.S)
REAL_PATHS = ("/models/",)


def python_blocks(text: str) -> list[tuple[bool, str]]:
    """`(needs a real checkpoint, code)` for each Python block, in order."""
    return [(bool(m["marker"]) and m["marker"].strip() == REAL, m["code"]) for m in BLOCK.finditer(text)]


def tiny_chat_llada(path: Path, preset: str = "tiny-llada") -> Path:
    config = jaxdllm.ModelConfig.preset(preset, vocab_size=101, mask_token_id=3, eos_token_id=2,
                                        eot_token_id=2, pad_token_id=0, bos_token_id=1)
    jaxdllm.save_pretrained(jaxdllm.Transformer(config, rngs=nnx.Rngs(0)), path)
    save_char_tokenizer(path)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                         "{% if add_generation_prompt %}={% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


def test_blocks_that_name_a_real_checkpoint_are_marked():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 6
    unmarked = [code for real, code in blocks if not real and any(p in code for p in REAL_PATHS)]
    assert not unmarked, f"README blocks name a real checkpoint without `{REAL}`: {unmarked}"
    assert any(not real for real, _ in blocks), "no block runs as written"


def free_names(code: str) -> list[str]:
    """Names `code` reads that it never binds (no assignment, import, def or class) and that are
    not builtins: what a block would take from an earlier one."""
    top = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    free = set()

    def visit(table):
        for s in table.get_symbols():
            reads_global = s.is_referenced() and (table is top or s.is_global())
            if reads_global and s.get_name() not in bound:
                free.add(s.get_name())
        for child in table.get_children():
            visit(child)

    visit(top)
    return sorted(free - set(dir(builtins)))


def test_free_names_finds_what_a_block_takes_from_another():
    assert free_names("import jax\nx = jax.numpy.ones(2)\nprint([y for y in x], x)") == []
    assert free_names("out = jaxdllm.generate(model)\ndef f():\n    return jnp.ones(n)") == [
        "jaxdllm", "jnp", "model", "n"]


def test_each_block_stands_alone():
    """A block a user copies runs by itself: it imports and defines every name it uses."""
    leaning = {i: names for i, (_, code) in enumerate(python_blocks(README.read_text())) if (names := free_names(code))}
    assert not leaning, f"README blocks use names they never define (block index: names): {leaning}"


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_readme_python_blocks_run(tmp_path):
    model_dir = tiny_chat_llada(tmp_path / "llada")
    moe_dir = tiny_chat_llada(tmp_path / "llada2", "tiny-llada2")  # stands in for LLaDA2.0-mini
    gemma_dir = tiny_chat_llada(tmp_path / "diffusiongemma", "tiny-diffusiongemma")  # for DiffusionGemma-26B-A4B
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    work = tmp_path / "work"  # an empty working folder: shipped models must resolve by name
    work.mkdir()
    parts = []
    for i, (real, code) in enumerate(python_blocks(README.read_text())):
        if real:
            code = (code.replace('"/tmp/', f'"{scratch}/').replace("/models/LLaDA-8B-Instruct", str(model_dir))
                    .replace("/models/LLaDA2.0-mini", str(moe_dir))
                    .replace("/models/diffusiongemma-26B-A4B-it", str(gemma_dir)))
        parts.append(f"print('--- README block {i}', flush=True)\n{code}")
    script = work / "readme_blocks.py"
    script.write_text("\n".join(parts))
    # 8 CPU devices (the mesh blocks); the test processes' quick-compile flags are kept (tests/conftest.py:
    # the same programs and floating-point semantics, the blocks print the same; a fifth less time)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", "")).split()
    env = {**os.environ, "XLA_FLAGS": " ".join([*flags, "--xla_force_host_platform_device_count=8"]),
           "JAXDLLM_COMPILATION_CACHE": "off"}
    env.pop("PYTHONPATH", None)  # the installed package, as a user has it
    result = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    out = result.stdout
    assert "['1284', '13579'] [16 16]" in out and "['1284', '13579'] [1 1]" in out
    assert "['9853562951413'] [2]" in out and "\n[14]\n" in out
    assert "\n[6]\n" in out and "['4821399501'] [3]" in out  # Jacobi, then Lookahead with the prompt pool
    assert "['13579'] [1]" in out  # Learn2PD with the shipped filter
    wrong = printed_comments_that_differ(python_blocks(README.read_text()), out)
    assert not wrong, f"README comments that are not what their print line prints (block, comment, printed): {wrong}"


PRINT_COMMENT = re.compile(r"^print\(.*\)\s+# (?P<comment>.+)$")


def printed_comments_that_differ(blocks, out: str) -> list[tuple[int, str, list[str]]]:
    """For each `print(...)  # shown` line of a block that runs as written: `shown` (up to a `: `
    that starts an explanation) must be a line its block printed. Returns the ones that are not,
    with what the block printed."""
    sections = re.split(r"^--- README block (\d+)\n", out, flags=re.M)
    printed = {int(i): text.splitlines() for i, text in zip(sections[1::2], sections[2::2])}
    wrong = []
    for i, (real, code) in enumerate(blocks):
        if real:  # a tiny random model stands in for the real one: its prints differ
            continue
        for line in code.splitlines():
            m = PRINT_COMMENT.match(line.strip())
            if m:
                shown = re.split(r":\s", m["comment"], maxsplit=1)[0].strip()
                if shown not in printed.get(i, []):
                    wrong.append((i, shown, printed.get(i, [])))
    return wrong


def test_printed_comments_that_differ_reads_each_blocks_output():
    blocks = [(False, "x = 1\nprint(x, [2])   # 1 [2]: a note\n"), (True, "print(3)  # 4\n"),
              (False, "print([1 1])  # [1 1]\n")]
    out = "--- README block 0\n1 [2]\n--- README block 1\n3\n--- README block 2\n[2 1]\n"
    assert printed_comments_that_differ(blocks, out) == [(2, "[1 1]", ["[2 1]"])]


def test_the_first_install_is_the_package_alone_and_the_tests_install_is_cis():
    """A newcomer's two steps: `pip install -e .` then `jaxdllm generate` (no test extras), and under
    Run the tests the extras install that CI runs (`.ci/run`) before the test command."""
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S)[1]
    assert re.search(r"^pip install -e \.\s", first, re.M) and "\njaxdllm generate " in first, first
    block = re.search(r"```bash\n(.*?)```", text.split("## Run the tests", 1)[1], re.S)[1]
    extras = re.search(r'^pip install -e "\.\[([^\]]*)\]"', block, re.M)[1]
    assert {"test", "eval", "notebooks"} <= set(extras.split(",")) and "python -m pytest" in block
    ci = (README.parent / ".ci" / "run").read_text()
    # CI may add pip options (-q, --no-compile) but installs exactly the README's extras
    assert re.search(rf'^python -m pip install( -[-\w]+)* -e "\.\[{re.escape(extras)}\]"', ci, re.M), extras


def test_the_architecture_map_names_every_module_and_package():
    """README's map agrees with the tree: every top-level module and package of `jaxdllm/`, and
    every file of `jaxdllm/attention/`, is named in the Architecture section."""
    section = README.read_text().split("## Architecture", 1)[1]
    package = README.parent / "jaxdllm"
    names = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    names += [f"{p.name}/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    names += [p.name for p in (package / "attention").glob("*.py") if p.name != "__init__.py"]
    missing = [n for n in names if n not in section and n.removesuffix(".py") + ".py" not in section
               and f"`{n.removesuffix('.py')}`" not in section]
    assert not missing, f"README's Architecture section does not name {missing}"
