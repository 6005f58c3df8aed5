"""`jaxdllm generate`: decode one prompt and print the answer (NFE and speed on stderr)."""

from __future__ import annotations

import argparse
import sys
import textwrap

from jaxdllm.cli.common import add_mesh_argument, inference_mesh, open_model, parse_sets, warn_cache_notes
from jaxdllm.distributed import add_arguments
from jaxdllm.models.run_options import QUANTIZATIONS

NAME = "generate"
COMPILES = True
JOINS = True  # joins a multi-process job (`jaxdllm.distributed`) before it runs
RESUMES = None
MEMORY = "--gen-length or the prompt"  # what to lower when the device runs out of memory


def preset_list() -> str:
    """The `--help` text that lists the sampler presets, one line each (`SAMPLER_PRESET_SUMMARIES`)."""
    from jaxdllm.decoding.config import SAMPLER_PRESET_SUMMARIES, SAMPLER_PRESETS

    width = max(map(len, SAMPLER_PRESETS))
    lines = [f"  {name:<{width}}  {SAMPLER_PRESET_SUMMARIES.get(name, '')}".rstrip() for name in SAMPLER_PRESETS]
    return ("presets (--preset NAME; each published at 256 tokens, rescaled to --gen-length):\n"
            + "\n".join(lines) + "\n\nexample: jaxdllm generate --model tasks-llada2-tiny --preset llada2 "
            "--prompt \"reverse 4821=\"")


def add_parser(sub) -> None:
    """The `generate` subcommand and its flags."""
    from jaxdllm.decoding.caches import CACHES
    from jaxdllm.decoding.policies import POLICIES

    p = sub.add_parser(NAME, help="decode a prompt with a diffusion LLM",
                       description=textwrap.fill(
                           "Decode one prompt: the answer on stdout; on stderr the forwards (NFE), a drafting "
                           "model's forwards when one drafts, the answer's tokens and the time. Settings come "
                           "from the checkpoint, then --preset, then the flags and --set.", 88),
                       epilog=preset_list(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="checkpoint folder or shipped name (default: the shipped tasks-llada-small)")
    p.add_argument("--prompt", required=True, help="the text to continue (a chat prompt where the "
                                                   "checkpoint has a chat template; see --no-chat)")
    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None,
                   help="weight-only int8 for the linear layers and LM head, quantized as the weights load")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="sampler preset, listed below (default: the checkpoint's own settings: "
                        "llada for a diffusion model, jacobi for a causal one)")
    p.add_argument("--gen-length", dest="gen_length", type=int, metavar="N",
                   help="tokens to generate (the answer's length; the block length and steps are rescaled "
                        "to it unless given)")
    p.add_argument("--block-length", dest="block_length", type=int, metavar="N",
                   help="the diffusion block: tokens decoded per block, left to right (diffusion models only)")
    p.add_argument("--window", type=int, metavar="N",
                   help="Jacobi's draft window: tokens a step may accept (jacobi, jacobi-forcing; a causal "
                        "model's default); same as --set window=N")
    p.add_argument("--steps", type=int, metavar="N",
                   help="decoding steps over the whole answer for the scheduled policies (llada: "
                        "gen-length steps commit one token each)")
    p.add_argument("--policy", metavar="NAME",
                   help=f"what a step commits: {', '.join(sorted(POLICIES))}")
    p.add_argument("--cache", metavar="NAME",
                   help=f"the KV cache between steps: {', '.join(sorted(CACHES))} (none: every step "
                        "runs the whole canvas)")
    p.add_argument("--threshold", type=float, metavar="P",
                   help="confidence a position needs to commit (threshold policies, in (0, 1])")
    p.add_argument("--temperature", type=float, metavar="T",
                   help="sampling temperature (0: greedy, the default)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any other SamplerConfig setting, e.g. --set stop_at_eos=true (repeatable)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="random seed of the sampling (temperature > 0, random remasking; default 0)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--allow-unk", dest="allow_unk", action="store_true",
                   help="decode characters the tokenizer does not know as its unk token instead of stopping")
    add_mesh_argument(p)
    add_arguments(p)
    p.set_defaults(func=run)


def sampler_config(args, model_dir):
    """The checkpoint's sampler defaults (`jaxdllm.sampler_defaults`) with `--preset`, `--set` and the
    flags; `model_dir`: the checkpoint's folder or `Checkpoint`."""
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.pretrained import sampler_defaults

    overrides = parse_sets(args.set)
    for name in ("gen_length", "block_length", "window", "steps", "policy", "cache", "threshold", "temperature"):
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
    checkpoint = open_model(args)  # the folder found and config.json parsed once, for every loader below
    config = sampler_config(args, checkpoint)  # bad options fail before any loading
    warn_cache_notes(checkpoint, [config])
    params = policy_params(checkpoint, config)  # e.g. Learn2PD's filter beside the model
    model = from_pretrained(checkpoint, quantization=args.quantize, mesh=inference_mesh(args))
    tok = Tokenizer.from_pretrained(checkpoint)
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
    if jax.process_index() == 0:  # a multi-process job prints its answer once
        print(tok.decode(tokens.tolist(), skip_special_tokens=True))
        answer = answer_length(tokens, model.config.eos_token_id)
        print(status_line(out, answer, len(tokens), seconds), file=sys.stderr)
    return 0


def status_line(out, answer: int, generated: int, seconds: float) -> str:
    """`[nfe N | drafter forwards D | A answer tokens of G | ...]` for the first row of `out`
    (`GenerateResult`); the drafter's part only where a second model drafts (`drafter_forwards`)."""
    nfe = int(out.nfe[0])
    drafter = "" if out.drafter_forwards is None else f" | drafter forwards {int(out.drafter_forwards[0])}"
    return (f"[nfe {nfe}{drafter} | {answer} answer tokens of {generated} | {answer / max(nfe, 1):.2f} answer "
            f"tokens/forward | {seconds:.2f}s incl. compile]")
