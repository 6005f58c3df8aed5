"""The MOSES molecules as SAFE strings: GenMol's data preparation on data that installs offline.

The `molsets` wheel on PyPI carries the MOSES sets (`moses/dataset/data/{train,test}.csv.gz`; 1,584,663
training SMILES, MIT licence, (c) Insilico Medicine). `prepare` fetches the wheel with pip without
installing it (installing would pull torch and old pins), reads the CSVs from the zip, encodes each
SMILES as SAFE (BRICS cuts, stereo ignored, uncuttable molecules kept whole: GenMol's
`preprocess_data.py`), counts the failures, and writes a data folder:

  train.tsv.gz, valid.tsv.gz, test.tsv.gz   one `SMILES<TAB>SAFE` per line (valid: held out of MOSES train)
  tokenizer/                                the SAFE tokenizer built from train (`safe_tokenizer`)
  lengths.json                              the histogram of the training SAFE strings' token lengths (no
                                            [CLS]/[SEP]): the distribution GenMol's sampler draws lengths from
  stats.json                                counts, failures, the wheel's name and sha256, the licence
  safe_format.json                          how the strings write attachments (`jaxdllm.molecules.bracket_safe`)

GenMol V2's data (`--format bracket --views K`): attachments written `<k>`, and each training molecule
written as K random views (atoms and fragments shuffled; GenMol V2 draws a fresh view per epoch, so K views
stand in for K epochs). Validation and test stay canonical.

    python -m jaxdllm.molecules.moses --out data/moses_safe --train 200000 --valid 5000 --test 5000
    python -m jaxdllm.molecules.moses --out data/moses_bracket --format bracket --views 4
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import multiprocessing
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxdllm.errors import DataError

LENGTHS_FILE = "lengths.json"  # the length histogram, in a data folder and beside a model trained on it

WHEEL = "molsets==0.3.1"
MEMBERS = {"train": "moses/dataset/data/train.csv.gz", "test": "moses/dataset/data/test.csv.gz"}
SHIPPED = Path("training/data/moses_safe")
LICENCE = "MIT (the molsets wheel's LICENSE; (c) 2018 Insilico Medicine); MOSES is filtered ZINC Clean Leads"


def shipped_data_dir() -> Path:
    """The prepared slice that comes with a source checkout (`training/data/moses_safe`), from any folder."""
    from jaxdllm.shipped import _roots

    for root in _roots():
        if (root / SHIPPED / "train.tsv.gz").is_file():
            return root / SHIPPED
    raise DataError(f"{SHIPPED} is not here (it comes with a clone of the repository): prepare a folder with "
                    "`python -m jaxdllm.molecules.moses --out DIR` and pass it")


def fetch_wheel(cache_dir: str | Path) -> Path:
    """The molsets wheel in `cache_dir` (downloaded with `pip download --no-deps` when absent)."""
    cache_dir = Path(cache_dir)
    found = sorted(cache_dir.glob("molsets-*.whl"))
    if found:
        return found[-1]
    cache_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           WHEEL, "-d", str(cache_dir)], capture_output=True, text=True)
    found = sorted(cache_dir.glob("molsets-*.whl"))
    if done.returncode or not found:
        raise DataError(f"pip could not download {WHEEL} into {cache_dir}:\n{done.stderr[-2000:]}")
    return found[-1]


def read_moses(wheel: str | Path, split: str = "train") -> list[str]:
    """The SMILES of MOSES's `split` (`train` or `test`), in file order, read from the wheel's zip."""
    if split not in MEMBERS:
        raise DataError(f"MOSES split must be one of {sorted(MEMBERS)}, got {split!r}")
    with zipfile.ZipFile(wheel) as archive:
        text = gzip.decompress(archive.read(MEMBERS[split])).decode()
    rows = csv.reader(io.StringIO(text))
    header = next(rows)
    column = header.index("SMILES")
    return [row[column] for row in rows if row]


def _encode_one(job: tuple[str, str, int | None]) -> str | None:
    """`(SMILES, safe_format, seed)` -> its string: canonical when `seed` is None, else the random view `seed`."""
    from jaxdllm.molecules.bracket_safe import to_format
    from jaxdllm.molecules.safe_text import SafeEncodeError, smiles_to_safe

    smiles, safe_format, seed = job
    try:
        return to_format(smiles_to_safe(smiles, randomize=seed is not None, seed=seed), safe_format)
    except SafeEncodeError:
        return None


def encode_all(smiles: Sequence[str], workers: int = 1, *, safe_format: str = "safe", views: int = 0,
               seed: int = 0) -> tuple[list[tuple[str, str]], list[str]]:
    """`(pairs (SMILES, SAFE) in input order, the SMILES that failed)`; `workers` processes.
    `safe_format`: `"safe"` or `"bracket"`; `views`: 0 writes each molecule once, canonical; K > 0 writes
    K random views of each (seeded by `seed`, the molecule's index and the view), one pair per view."""
    from jaxdllm.molecules.bracket_safe import check_format

    check_format(safe_format)
    if views:
        jobs = [(s, safe_format, (seed * len(smiles) + i) * views + v) for i, s in enumerate(smiles)
                for v in range(views)]
    else:
        jobs = [(s, safe_format, None) for s in smiles]
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            encoded = pool.map(_encode_one, jobs, chunksize=512)
    else:
        encoded = [_encode_one(j) for j in jobs]
    pairs = [(job[0], e) for job, e in zip(jobs, encoded) if e is not None]
    failed = list(dict.fromkeys(job[0] for job, e in zip(jobs, encoded) if e is None))  # in input order, once
    return pairs, failed


def write_pairs(path: Path, pairs: Sequence[tuple[str, str]]) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(f"{smiles}\t{safe}\n" for smiles, safe in pairs)


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """The `(SMILES, SAFE)` pairs of a `*.tsv.gz` (or plain `.tsv`) written by `prepare`."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        pairs = [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]
    bad = [i for i, p in enumerate(pairs) if len(p) != 2]
    if bad:
        raise DataError(f"{path}: line {bad[0] + 1} is not `SMILES<TAB>SAFE`")
    return pairs


def write_length_histogram(path: Path, lengths: Sequence[int]) -> None:
    """`{"token_lengths": {length: molecules}}`: the SAFE token lengths (no [CLS]/[SEP]) of a training set."""
    values, counts = np.unique(np.asarray(lengths), return_counts=True)
    path.write_text(json.dumps({"token_lengths": {int(v): int(c) for v, c in zip(values, counts)}}) + "\n")


def read_length_histogram(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """`(lengths [K] int, probabilities [K] float)` of a `lengths.json`: the distribution GenMol's
    sampler draws a molecule's token count from."""
    table = json.loads(Path(path).read_text())["token_lengths"]
    lengths = np.asarray([int(k) for k in table], np.int64)
    counts = np.asarray(list(table.values()), np.float64)
    return lengths, counts / counts.sum()


def prepare(out: str | Path, *, train: int | None = 200_000, valid: int = 5_000, test: int = 5_000,
            seed: int = 0, workers: int = 1, cache_dir: str | Path | None = None, safe_format: str = "safe",
            views: int = 0) -> dict:
    """Write the data folder described in the module docstring; returns its `stats.json` dict.

    Args:
      out: the folder.
      train, valid: molecules drawn (without replacement, `seed`) from MOSES train; `train=None`
        takes all the rest. test: the first molecules of a `seed` permutation of MOSES test.
      workers: encoding processes.
      cache_dir: where the wheel is kept (default `out/.wheel`).
      safe_format: `"safe"` (GenMol V1's strings) or `"bracket"` (V2's: attachments as `<k>`).
      views: 0: each training molecule once, canonical; K > 0: K random views of each (V2's training data).
    """
    from jaxdllm.molecules.bracket_safe import write_safe_format
    from jaxdllm.molecules.safe_tokenizer import build_safe_tokenizer, save_safe_tokenizer, split_safe

    out = Path(out)
    wheel = fetch_wheel(cache_dir or out / ".wheel")
    rng = np.random.default_rng(seed)
    moses_train = read_moses(wheel, "train")
    order = rng.permutation(len(moses_train))
    valid_smiles = [moses_train[i] for i in order[:valid]]
    stop = len(order) if train is None else valid + train
    train_smiles = [moses_train[i] for i in order[valid:stop]]
    moses_test = read_moses(wheel, "test")
    test_smiles = [moses_test[i] for i in rng.permutation(len(moses_test))[:test]]
    out.mkdir(parents=True, exist_ok=True)
    stats = {"source": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "licence": LICENCE,
             "encoding": "safe-mol SAFEConverter(slicer='brics', ignore_stereo=True).encoder(allow_empty=True)",
             "safe_format": safe_format, "training_views": views, "seed": seed, "splits": {}}
    for name, smiles in (("train", train_smiles), ("valid", valid_smiles), ("test", test_smiles)):
        pairs, failed = encode_all(smiles, workers, safe_format=safe_format, views=views if name == "train" else 0,
                                   seed=seed)
        write_pairs(out / f"{name}.tsv.gz", pairs)
        stats["splits"][name] = {"molecules": len(smiles), "encoded": len(pairs), "failed": len(failed),
                                 "failed_examples": failed[:5]}
        if name == "train":
            tokenizer = build_safe_tokenizer(s for _, s in pairs)
            save_safe_tokenizer(tokenizer, out / "tokenizer")
            lengths = [len(split_safe(s)) for _, s in pairs]
            write_length_histogram(out / LENGTHS_FILE, lengths)
            stats["vocab_size"] = tokenizer.vocab_size
            stats["length"] = {"mean": float(np.mean(lengths)), "min": int(min(lengths)), "max": int(max(lengths))}
    write_safe_format(out, safe_format)
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the data folder to write")
    parser.add_argument("--train", type=int, default=200_000, help="training molecules (0: all)")
    parser.add_argument("--valid", type=int, default=5_000)
    parser.add_argument("--test", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=max(1, (multiprocessing.cpu_count() or 1)))
    parser.add_argument("--cache-dir", default=None, help="where the molsets wheel is kept")
    parser.add_argument("--format", default="safe", choices=("safe", "bracket"),
                        help="bracket: GenMol V2's strings, attachments written <k>")
    parser.add_argument("--views", type=int, default=0,
                        help="random views per training molecule (0: one canonical string each)")
    args = parser.parse_args(argv)
    stats = prepare(args.out, train=args.train or None, valid=args.valid, test=args.test, seed=args.seed,
                    workers=args.workers, cache_dir=args.cache_dir, safe_format=args.format, views=args.views)
    print(json.dumps({k: v for k, v in stats.items() if k != "sha256"}, indent=2))


if __name__ == "__main__":
    main()
