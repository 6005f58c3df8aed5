"""`jaxdllm-lm-eval` / `python -m jaxdllm.eval.lm_eval_cli`: lm-eval's command line with the
`jaxdllm` model registered and jaxdllm's offline task configs on the include path."""

from __future__ import annotations

import sys
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"


def main(argv: list[str] | None = None) -> None:
    """Run lm-eval's `run` / `ls` / `validate` with `--include_path` set to `TASK_DIR`."""
    from jaxdllm.extras import MissingExtraError, require

    try:
        require("lm_eval", "eval", "jaxdllm-lm-eval")
    except MissingExtraError as e:
        sys.exit(f"jaxdllm-lm-eval: error: {e}")
    import jaxdllm.eval.harness  # noqa: F401  registers the model "jaxdllm"
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "ls", "validate") and "--include_path" not in argv:
        argv += ["--include_path", str(TASK_DIR)]
    sys.argv = ["jaxdllm-lm-eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
