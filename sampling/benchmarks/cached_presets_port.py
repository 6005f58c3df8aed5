"""Fast-dLLM cached presets on the shipped task model: jaxdllm against the PyTorch eager port.

Decodes held-out suite prompts (drawn as `jaxdllm eval` draws them: `split="test"`, seed 1234)
with checkpoints/tasks-llada-small loaded in float32 on both sides, with the threshold policy
(0.9) and cache none / prefix / dual at the checkpoint's sampler defaults (gen_length 16, one
block of 16). jaxdllm decodes each task's prompts as one left-padded batch, as `jaxdllm eval`
does; the port (`sampling/torch_reference/torch_port.py` on `sampling/torch_reference/torch_llada.py`) decodes each prompt alone,
its MASK logit set to -1e30 (jaxdllm never predicts MASK). Per cache it counts the rows whose
generated tokens, NFE and commit steps are equal, and each side's valid answers (task checker).

    python -m sampling.benchmarks.cached_presets_port        # writes sampling/results/cached_presets_port_cpu.json
"""

from pathlib import Path

from jaxdllm.extras import exit_if_missing

exit_if_missing(("torch",), "bench", "python -m sampling.benchmarks.cached_presets_port")

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402

import jaxdllm  # noqa: E402
from jaxdllm.data import get_task, make_split  # noqa: E402
from jaxdllm.eval.runner import left_pad  # noqa: E402
from jaxdllm.tokenizer import decode_response  # noqa: E402
from sampling.torch_reference.torch_llada import TorchLLaDA  # noqa: E402
from sampling.benchmarks.report import torch_facts, write_report  # noqa: E402
from sampling.torch_reference.torch_port import generate as port_generate  # noqa: E402

MODEL = jaxdllm.checkpoint_dir("tasks-llada-small")
OUT = Path("sampling/results/cached_presets_port_cpu.json")
PRESETS = {"none": "fast-dllm-parallel", "prefix": "fast-dllm-prefix", "dual": "fast-dllm-dual"}
N = {"perm": 20, "pick3": 20, "copy": 8, "reverse": 8, "sort": 8, "add": 8}
SEED, GEN, BLOCK = 1234, 16, 16


class NoMask(torch.nn.Module):
    """The port's model with the MASK logit at -1e30, as in tests/decoding/test_torch_port_caches.py."""

    def __init__(self, model, mask_id):
        super().__init__()
        self.model, self.mask_id = model, mask_id

    def _fix(self, logits):
        logits = logits.clone()
        logits[..., self.mask_id] = -1e30
        return logits

    def forward(self, ids):
        return self._fix(self.model(ids))

    def full(self, ids):
        logits, kv = self.model.full(ids)
        return self._fix(logits), kv

    def window(self, ids, start, kv, logits_len=None):
        return self._fix(self.model.window(ids, start, kv, logits_len))


def main():
    jax_model = jaxdllm.from_pretrained(MODEL, dtype="float32")
    tok = jaxdllm.Tokenizer.from_pretrained(MODEL)
    mask_id, eos, pad = jax_model.config.mask_token_id, jax_model.config.eos_token_id, jax_model.config.pad_token_id
    port = NoMask(TorchLLaDA.from_pretrained(MODEL, dtype=torch.float32).eval(), mask_id)
    hf_tok = tokenizers.Tokenizer.from_file(str(MODEL / "tokenizer.json"))  # independent encoding check

    items = {task: make_split(task, n, SEED, split="test") for task, n in N.items()}
    encodings_equal = all(tok.encode(e.prompt) == hf_tok.encode(e.prompt).ids
                          for examples in items.values() for e in examples)
    report = {"model": str(MODEL), "dtype": "float32", "seed": SEED, "n": N,
              "prompt_encoding_equal": encodings_equal, "caches": {}}
    for cache, preset in PRESETS.items():
        config = jaxdllm.SamplerConfig.preset(preset, gen_length=GEN, block_length=BLOCK, steps=GEN)
        rows = {"rows": 0, "equal_tokens": 0, "equal_nfe": 0, "equal_commit_step": 0, "per_task": {}, "examples": []}
        for task, examples in items.items():
            checker = get_task(task).check
            ids = [tok.encode(e.prompt) for e in examples]
            batch, mask = left_pad(ids, pad)
            out = jaxdllm.generate(jax_model, batch, config, attention_mask=mask)
            width = batch.shape[1]
            t = {"rows": 0, "equal_tokens": 0, "equal_nfe": 0, "valid_jaxdllm": 0, "valid_port": 0,
                 "nfe_jaxdllm": 0, "nfe_port": 0}
            for i, (e, row) in enumerate(zip(examples, ids)):
                with torch.no_grad():
                    ref = port_generate(port, torch.tensor([row]), gen_length=GEN, block_length=BLOCK, steps=GEN,
                                        mask_id=mask_id, policy="threshold", threshold=0.9, cache=cache)
                jt, pt = np.asarray(out.tokens[i, width:]), ref["tokens"][0, len(row):].numpy()
                jc, pc = np.asarray(out.commit_step[i, width:]), ref["commit_step"][0, len(row):].numpy()
                jn, pn = int(out.nfe[i]), int(ref["nfe"])
                ja, pa = decode_response(tok, jt, eos), decode_response(tok, pt, eos)
                same = bool(np.array_equal(jt, pt))
                t["rows"] += 1
                t["equal_tokens"] += same
                t["equal_nfe"] += jn == pn
                t["valid_jaxdllm"] += bool(checker(e.prompt, ja))
                t["valid_port"] += bool(checker(e.prompt, pa))
                t["nfe_jaxdllm"] += jn
                t["nfe_port"] += pn
                rows["equal_commit_step"] += bool(np.array_equal(jc, pc))
                if i < 3 or not same:
                    rows["examples"].append({"task": task, "prompt": e.prompt, "jaxdllm": ja, "port": pa,
                                             "nfe_jaxdllm": jn, "nfe_port": pn, "equal_tokens": same,
                                             "commit_step_port": pc.tolist()})
            for k in ("rows", "equal_tokens", "equal_nfe"):
                rows[k] += t[k]
            t["mean_nfe_jaxdllm"], t["mean_nfe_port"] = t.pop("nfe_jaxdllm") / t["rows"], t.pop("nfe_port") / t["rows"]
            rows["per_task"][task] = t
            print(f"{cache:6s} {task:8s} equal tokens {t['equal_tokens']}/{t['rows']}  equal NFE {t['equal_nfe']}  "
                  f"valid jaxdllm {t['valid_jaxdllm']} port {t['valid_port']}  "
                  f"mean NFE {t['mean_nfe_jaxdllm']:.2f} / {t['mean_nfe_port']:.2f}", flush=True)
        report["caches"][cache] = rows
    write_report(OUT, {**report, **torch_facts()})  # JSON only: counts of equal rows
    print(f"prompt encoding equal: {encodings_equal}; wrote {OUT}")


if __name__ == "__main__":
    main()
