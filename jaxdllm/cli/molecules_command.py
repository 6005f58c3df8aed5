"""`jaxdllm molecules`: GenMol's molecule design with a masked diffusion model over SAFE strings.

  jaxdllm molecules design --task denovo -n 20                          SMILES out, one per line
  jaxdllm molecules design --task motif --fragment "[*]c1ccc(Cl)cc1" -n 20
  jaxdllm molecules eval --out results/genmol [--causal moses-qwen2-small-causal]   JSON + PNG
  jaxdllm molecules optimize --oracle qed --budget 1000 --out results/qed          JSON + PNG

Tasks: denovo, motif (motif extension), scaffold (scaffold decoration), linker ("A.B", one [*] each; two
steps as published), linker-1step (both fragments in one canvas), superstructure (a fragment without attachment points). Needs the `molecules` extra (rdkit, safe-mol).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAME = "molecules"
COMPILES = True
RESUMES = None
MEMORY = "-n or --batch-size"

DEFAULT_GENMOL = "moses-bert-small-genmol"
DEFAULT_CAUSAL = "moses-qwen2-small-causal"
TASKS = ("denovo", "motif", "scaffold", "linker", "linker-1step", "superstructure")


def add_parser(sub) -> None:
    """The `molecules` subcommand and its three actions."""
    p = sub.add_parser(NAME, help="design molecules with a GenMol model (SMILES in, SMILES out)")
    actions = p.add_subparsers(dest="action", required=True)
    design = actions.add_parser("design", help="sample molecules for one task and print their SMILES")
    design.add_argument("--task", choices=TASKS, default="denovo")
    design.add_argument("--fragment", help="the fragment SMILES of motif/scaffold/linker/superstructure")
    for q in (design,):
        q.add_argument("-n", "--num-samples", dest="n", type=int, default=10)
    evaluate = actions.add_parser("eval", help="de novo and fragment metrics (GenMol's), JSON + PNG")
    evaluate.add_argument("-n", "--num-samples", dest="n", type=int, default=1000)
    evaluate.add_argument("--causal", default=None, help="a causal model of the same SAFE data to compare")
    evaluate.add_argument("--causal-temperature", type=float, default=1.0)
    evaluate.add_argument("--fragments", type=int, default=10,
                          help="held-out test molecules whose fragments the fragment tasks use (0: none)")
    evaluate.add_argument("--per-fragment", type=int, default=100, help="samples per fragment and task")
    evaluate.add_argument("--data", default=None,
                          help="the prepared data folder (default: the shipped slice, training/data/moses_safe)")
    optimize = actions.add_parser("optimize", help="fragment remasking against an oracle vs. random sampling")
    optimize.add_argument("--oracle", default="qed")
    optimize.add_argument("--budget", type=int, default=1000, help="oracle calls")
    optimize.add_argument("--warmup", type=int, default=100, help="oracle calls of recombination only")
    optimize.add_argument("--reference", type=int, default=5000, help="training molecules whose fragments seed it")
    optimize.add_argument("--data", default=None, help="the prepared data folder (default: the shipped slice)")
    for q in (design, evaluate, optimize):
        q.add_argument("--model", default=DEFAULT_GENMOL, help="checkpoint folder or shipped name")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--batch-size", type=int, default=64)
        q.add_argument("--lengths", default=None, help="lengths.json (default: the checkpoint's)")
        q.set_defaults(func=run)
    for q in (evaluate, optimize):
        q.add_argument("--out", required=True, help="the folder for the JSON and PNG files")


def run(args) -> int:
    """Run one action."""
    from jaxdllm.errors import InputError
    from jaxdllm.extras import require

    for module in ("rdkit", "safe"):
        require(module, "molecules", "jaxdllm molecules")
    from jaxdllm.molecules.design import Designer

    designer = Designer.load(args.model, lengths=args.lengths, batch_size=args.batch_size)
    if args.action == "design":
        if args.task != "denovo" and not args.fragment:
            raise InputError(f"--task {args.task} needs --fragment SMILES")
        if args.task == "denovo":
            samples = designer.denovo(args.n, seed=args.seed)
        else:
            from jaxdllm.molecules.evaluation import TASK_CALLS

            method, settings, _ = TASK_CALLS[args.task]
            samples = getattr(designer, method)(args.fragment, args.n, seed=args.seed, **settings)
        valid = samples.valid()
        for smiles in valid:
            print(smiles)
        print(f"{len(valid)} of {args.n} samples are valid molecules"
              + ("" if args.task == "denovo" else " containing the fragment"), file=sys.stderr)
        return 0
    from jaxdllm.molecules.moses import read_pairs, shipped_data_dir

    data = Path(args.data) if args.data else shipped_data_dir()
    if args.action == "eval":
        from jaxdllm.molecules.causal_baseline import CausalDesigner
        from jaxdllm.molecules.evaluation import evaluate_denovo, evaluate_fragments

        causal = CausalDesigner.load(args.causal, batch_size=args.batch_size) if args.causal else None
        training = [s for s, _ in read_pairs(data / "train.tsv.gz")[:args.n]]
        result = evaluate_denovo(designer, args.n, args.out, causal=causal, causal_temperature=args.causal_temperature,
                                 training_smiles=training, seed=args.seed)
        if args.fragments:
            test = [s for s, _ in read_pairs(data / "test.tsv.gz")[:args.fragments * 3]]
            from jaxdllm.molecules.evaluation import fragment_tasks

            chosen = [s for s in test if fragment_tasks(s)][:args.fragments]
            result["fragments"] = evaluate_fragments(designer, chosen, args.per_fragment, args.out,
                                                     seed=args.seed)["tasks"]
        print(json.dumps({k: v for k, v in result.items() if k != "per_fragment"}, indent=1))
        return 0
    from jaxdllm.molecules.oracles import oracle
    from jaxdllm.molecules.remasking import RemaskingConfig, fragment_remasking, random_sampling, write_comparison

    score = oracle(args.oracle)
    reference = [s for s, _ in read_pairs(data / "train.tsv.gz")[:args.reference]]
    config = RemaskingConfig(warmup=args.warmup, batch_size=min(args.batch_size, 32))
    remasked = fragment_remasking(designer, score, args.oracle, args.budget, reference, config=config, seed=args.seed)
    sampled = random_sampling(designer, score, args.budget, seed=args.seed)
    summary = write_comparison(args.out, args.oracle, args.budget, {"fragment remasking": remasked,
                                                                     "random sampling": sampled})
    print(json.dumps(summary, indent=1))
    return 0
