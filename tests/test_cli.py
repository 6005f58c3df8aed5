"""The jaxdllm command line on a tiny checkpoint, run as a user would run it."""

import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

from hf_models import make_hf_model


def _run(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "jaxdllm.cli", *args], capture_output=True, text=True, env=env)


def test_inspect_and_convert(tmp_path):
    make_hf_model("qwen2", "gqa").save_pretrained(tmp_path / "src")
    out = _run("inspect", str(tmp_path / "src"), "--load")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["model_type"], info["num_heads"], info["num_kv_heads"], info["logits_finite"]) == ("qwen2", 6, 2, True)

    out = _run("convert", str(tmp_path / "src"), str(tmp_path / "bf16"), "--dtype", "bfloat16")
    assert out.returncode == 0, out.stderr
    src, dst = load_file(str(tmp_path / "src" / "model.safetensors")), load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert sorted(src) == sorted(dst) and all(t.dtype.name == "bfloat16" for t in dst.values())
    np.testing.assert_allclose(dst["lm_head.weight"].astype(np.float32), src["lm_head.weight"], rtol=1e-2)


def test_readable_error_for_a_bad_directory(tmp_path):
    out = _run("inspect", str(tmp_path))
    assert out.returncode == 2
    assert "jaxdllm inspect: error:" in out.stderr and "config.json is missing" in out.stderr
    assert "Traceback" not in out.stderr
