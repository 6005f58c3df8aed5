"""`jaxdllm generate`: decode one prompt and print the answer (NFE and speed on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

from jaxdllm.cli.common import model_dir, parse_sets, warn_cache_notes
from jaxdllm.models.run_options import QUANTIZATIONS

NAME = "generate"
COMPILES = True
RESUMES = None
MEMORY = "--gen-length or the prompt"  # what to lower when the device runs out of memory


def add_parser(sub) -> None:
    """The `generate` subcommand and its flags."""
    p = sub.add_parser(NAME, help="decode a prompt with a diffusion LLM")
    p.add_argument("--model", default=None,
                   help="checkpoint folder or shipped name (default: the shipped tasks-llada-small)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None,
                   help="weight-only int8 for the linear layers and LM head, quantized as the weights load")
    p.add_argument("--preset", default=None,
                   help="sampler preset (see SamplerConfig.preset; default: the checkpoint's own settings, "
                        "llada for a diffusion model, jacobi for a causal one)")
    p.add_argument("--gen-length", dest="gen_length", type=int)
    p.add_argument("--block-length", dest="block_length", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--policy")
    p.add_argument("--cache")
    p.add_argument("--threshold", type=float)
    p.add_argument("--temperature", type=float)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="any other SamplerConfig field")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--allow-unk", dest="allow_unk", action="store_true",
                   help="decode characters the tokenizer does not know as its unk token instead of stopping")
    p.set_defaults(func=run)


def sampler_config(args, model_dir: Path):
    """The checkpoint's sampler defaults (`jaxdllm.sampler_defaults`) with `--preset`, `--set` and the flags."""
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.pretrained import sampler_defaults

    overrides = parse_sets(args.set)
    for name in ("gen_length", "block_length", "steps", "policy", "cache", "threshold", "temperature"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    unknown = sorted(set(overrides) - set(SamplerConfig.option_names()))
    if unknown:
        raise ConfigError(f"unknown sampler option(s) {unknown}; options: {list(SamplerConfig.option_names())}")
    return sampler_defaults(model_dir, args.preset, **overrides)


def run(args) -> int:
    """Decode `--prompt`; the answer on stdout, NFE and timing on stderr."""
    import time

    import jax
    import numpy as np

    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.decoding import generate
    from jaxdllm.errors import ConfigError
    from jaxdllm.pretrained import policy_params
    from jaxdllm.tokenizer import Tokenizer, answer_length

    if not args.prompt.strip():
        raise ConfigError("--prompt is empty: give the text to continue")
    directory = model_dir(args)
    config = sampler_config(args, directory)  # bad options fail before any loading
    warn_cache_notes(directory, [config])
    params = policy_params(directory, config)  # e.g. Learn2PD's filter beside the model
    model = from_pretrained(directory, quantization=args.quantize)
    tok = Tokenizer.from_pretrained(directory)
    if not args.allow_unk:
        tok.check_known(args.prompt)
    if tok.chat_template and not args.no_chat:
        ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=True)
    else:
        ids = tok.encode(args.prompt)
    t0 = time.perf_counter()
    out = generate(model, np.asarray([ids], np.int32), config, key=jax.random.PRNGKey(args.seed),
                   policy_params=params)
    tokens = np.asarray(out.tokens[0, len(ids):])
    seconds = time.perf_counter() - t0
    print(tok.decode(tokens.tolist(), skip_special_tokens=True))
    nfe = int(out.nfe[0])
    answer = answer_length(tokens, model.config.eos_token_id)
    print(f"[nfe {nfe} | {answer} answer tokens of {len(tokens)} | {answer / nfe:.2f} answer tokens/forward "
          f"| {seconds:.2f}s incl. compile]", file=sys.stderr)
    return 0
