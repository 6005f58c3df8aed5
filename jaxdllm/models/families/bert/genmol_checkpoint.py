"""GenMol's Lightning checkpoint -> a transformers `BertForMaskedLM` folder that jaxdllm loads.

GenMol (NVIDIA, arXiv 2501.06158) publishes its weights as a PyTorch Lightning pickle (`model.ckpt` of
`nvidia/NV-GenMol-89M-v1`, NGC `genmol_v1`/`genmol_v2`), not as safetensors. It holds:

* `state_dict`: the backbone's tensors under `backbone.` (`backbone.bert.…`, `backbone.cls.predictions.…`);
* `hyper_parameters["config"]`: GenMol's `configs/base.yaml`, whose `model:` block are the keyword
  arguments of transformers' `BertConfig` (an OmegaConf `DictConfig` or a plain dict);
* `ema`: `{decay, num_updates, shadow_params}`, the parameter EMA GenMol samples with; `shadow_params`
  are tensors in `backbone.parameters()` order (tied parameters once).

GenMol V2 (`training.use_bracket_safe: true` in that config) writes attachments as `<k>` (bracket SAFE); the
converted folder's `safe_format.json` records which format the model writes, and `jaxdllm.molecules.Designer`
reads it. V2's tokenizer is V1's with `<` and `>` added (vocabulary 1882).

`convert_genmol_checkpoint` builds a `BertForMaskedLM` from that config (it fixes the order of
`named_parameters()`), loads the backbone's tensors, puts the EMA weights in their place (default) and
writes the folder with `save_pretrained` (safetensors, config.json with GenMol's special ids: [MASK] 4,
[CLS] 1 as bos, [SEP] 2 as eos, [PAD] 3). Reading the pickle runs its code (`torch.load(weights_only=
False)`): convert only checkpoints you trust. Needs torch and transformers (and omegaconf when the
checkpoint pickled a `DictConfig`).

GenMol's sampler draws each molecule's length from `data/len.pk` (a pickled list of token counts, [CLS] and
[SEP] included); `lengths_pk` writes it as the `lengths.json` that `Designer.load` reads beside the weights.

    python -m jaxdllm.models.families.bert.genmol_checkpoint model.ckpt genmol-v1 [--no-ema] [--tokenizer DIR] \
        [--lengths len.pk]
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from jaxdllm.errors import CheckpointError
from jaxdllm.models.families.bert.bert_config import GENMOL_IDS

PREFIX = "backbone."
# Buffers a BERT state_dict may carry (non-persistent in recent transformers): no parameter.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pt", ".pth")
# What `jaxdllm.molecules` reads beside the weights (that layer sits above this one): the text format
# (`bracket_safe.read_safe_format`) and the length histogram (`moses.read_length_histogram`).
SAFE_FORMAT_FILE = "safe_format.json"
LENGTHS_FILE = "lengths.json"


def _plain(value):
    """A plain dict/list tree from an OmegaConf `DictConfig`/`ListConfig`, a Lightning `AttributeDict` or a dict."""
    if isinstance(value, Mapping) or (hasattr(value, "keys") and hasattr(value, "__getitem__")
                                      and not isinstance(value, (str, bytes))):
        return {str(k): _plain(value[k]) for k in value.keys()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):  # a list, tuple or ListConfig
        return [_plain(v) for v in value]
    return value


def read_genmol_checkpoint(ckpt_path: str | Path) -> dict:
    """The unpickled Lightning checkpoint (on the CPU); errors name the file and what to do."""
    import torch

    path = Path(ckpt_path)
    if not path.is_file():
        raise CheckpointError(f"GenMol checkpoint {path} does not exist (a Lightning .ckpt file, e.g. model.ckpt "
                              "of nvidia/NV-GenMol-89M-v1)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except ModuleNotFoundError as e:
        raise CheckpointError(f"{path}: unpickling needs the module {e.name!r} (GenMol's checkpoint pickles its "
                              f"OmegaConf config): pip install {e.name.split('.')[0]}") from e
    if not isinstance(ckpt, Mapping) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a Lightning checkpoint: no 'state_dict' in it")
    return ckpt


def _genmol_config(ckpt: Mapping):
    """GenMol's config (`configs/base.yaml`) as plain dicts: `hyper_parameters["config"]`, or the hyperparameters."""
    hparams = _plain(ckpt.get("hyper_parameters") or {})
    return hparams.get("config", hparams)


def genmol_safe_format(ckpt: Mapping) -> str:
    """`"bracket"` when GenMol's config trained on bracket SAFE (`training.use_bracket_safe`, V2), else `"safe"`."""
    config = _genmol_config(ckpt)
    training = config.get("training") if isinstance(config, dict) else None
    return "bracket" if isinstance(training, dict) and training.get("use_bracket_safe") else "safe"


def genmol_model_config(ckpt: Mapping, where: str = "checkpoint") -> dict:
    """The `model:` block of GenMol's config (`hyper_parameters["config"]["model"]`): `BertConfig` kwargs."""
    config = _genmol_config(ckpt)
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict) or "hidden_size" not in model:
        found = sorted(config) if isinstance(config, dict) else config
        raise CheckpointError(f"{where}: no BERT config at hyper_parameters['config']['model'] (GenMol's "
                              f"configs/base.yaml `model:` block); found {found!r}")
    return {k: v for k, v in model.items() if not k.startswith("_")}


def write_genmol_lengths(len_pk: str | Path, out_dir: str | Path) -> Path:
    """GenMol's `len.pk` (a pickled list of SAFE token counts with [CLS] and [SEP]) as `out_dir/lengths.json`:
    `{"token_lengths": {count without [CLS]/[SEP]: molecules}}`, so a canvas gets GenMol's number of masks.
    Reading a pickle runs its code: use GenMol's own file."""
    import collections
    import pickle

    path = Path(len_pk)
    try:
        with open(path, "rb") as f:
            lengths = pickle.load(f)
        counts = collections.Counter(int(n) - 2 for n in lengths)
    except (OSError, pickle.UnpicklingError, TypeError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path}: not GenMol's len.pk (a pickled list of token counts): {e}") from None
    if not counts or min(counts) < 1:
        raise CheckpointError(f"{path}: holds no token counts above 2 ([CLS] and [SEP] alone)")
    out = Path(out_dir) / LENGTHS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"token_lengths": {str(k): counts[k] for k in sorted(counts)}}) + "\n")
    return out


def convert_genmol_checkpoint(ckpt_path: str | Path, out_dir: str | Path, *, use_ema: bool = True,
                              tokenizer_dir: str | Path | None = None, lengths_pk: str | Path | None = None) -> Path:
    """Write GenMol's Lightning checkpoint as a transformers `BertForMaskedLM` folder; returns `out_dir`.

    Args:
      ckpt_path: the Lightning `.ckpt` (see the module notes).
      out_dir: the folder to write (created): `model.safetensors`, `config.json`, `safe_format.json`.
      use_ema: the EMA weights (`ema.shadow_params`, what GenMol samples with) replace the trained ones,
        matched to `BertForMaskedLM.named_parameters()` in order; False keeps `state_dict`'s.
      tokenizer_dir: a folder whose tokenizer files (everything but config.json and weight files) are
        copied in too.
      lengths_pk: GenMol's `data/len.pk`, written as `lengths.json` (`write_genmol_lengths`).
    """
    import torch
    import transformers

    ckpt = read_genmol_checkpoint(ckpt_path)
    where = str(ckpt_path)
    kwargs = genmol_model_config(ckpt, where)
    config = transformers.BertConfig(**kwargs)
    model = transformers.BertForMaskedLM(config).eval()

    state = {k[len(PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(PREFIX)}
    if not state:
        raise CheckpointError(f"{where}: state_dict holds no '{PREFIX}…' tensors (GenMol's BERT backbone)")
    params = dict(model.named_parameters())
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k in params]
    unexpected = [k for k in unexpected if not k.endswith(_BUFFERS)]
    if missing or unexpected:
        raise CheckpointError(f"{where}: the backbone does not match its config's BertForMaskedLM: missing "
                              f"{missing[:8]}, unexpected {unexpected[:8]}")

    ema = ckpt.get("ema")
    if use_ema:
        shadow = list((ema or {}).get("shadow_params") or [])
        if not shadow:
            raise CheckpointError(f"{where}: no EMA weights (ema.shadow_params); convert with use_ema=False "
                                  "(--no-ema) to keep the trained weights")
        if len(shadow) != len(params):
            raise CheckpointError(f"{where}: ema.shadow_params holds {len(shadow)} tensors but the backbone has "
                                  f"{len(params)} parameters")
        with torch.no_grad():
            for (name, p), s in zip(params.items(), shadow):
                if tuple(s.shape) != tuple(p.shape):
                    raise CheckpointError(f"{where}: EMA tensor for {name} has shape {list(s.shape)}, expected "
                                          f"{list(p.shape)}")
                p.copy_(s.to(p.dtype))

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    file = out / "config.json"
    raw = json.loads(file.read_text())
    for key, value in GENMOL_IDS.items():  # the SAFE tokenizer's ids, where GenMol's config names none
        if kwargs.get(key) is None:
            raw[key] = value
    raw["genmol_checkpoint"] = {"source": Path(ckpt_path).name, "ema": bool(use_ema)}
    if use_ema:
        raw["genmol_checkpoint"]["ema_num_updates"] = int(ema.get("num_updates") or 0)
    file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    (out / SAFE_FORMAT_FILE).write_text(json.dumps({"safe_format": genmol_safe_format(ckpt)}) + "\n")
    if lengths_pk is not None:
        write_genmol_lengths(lengths_pk, out)
    if tokenizer_dir is not None:
        for f in sorted(Path(tokenizer_dir).iterdir()):
            if f.is_file() and f.name != "config.json" and not f.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(f, out / f.name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxdllm.models.families.bert.genmol_checkpoint",
                                     description="Convert GenMol's Lightning checkpoint to a transformers "
                                                 "BertForMaskedLM folder that jaxdllm loads.")
    parser.add_argument("ckpt", help="GenMol's Lightning .ckpt (e.g. model.ckpt of nvidia/NV-GenMol-89M-v1)")
    parser.add_argument("out", help="the folder to write")
    parser.add_argument("--no-ema", action="store_true", help="keep the trained weights instead of the EMA ones")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder to copy into the output")
    parser.add_argument("--lengths", default=None, help="GenMol's data/len.pk, written as lengths.json")
    args = parser.parse_args(argv)
    try:
        out = convert_genmol_checkpoint(args.ckpt, args.out, use_ema=not args.no_ema, tokenizer_dir=args.tokenizer,
                                        lengths_pk=args.lengths)
    except CheckpointError as e:
        parser.exit(2, f"error: {e}\n")
    print(f"wrote {out} ({'EMA' if not args.no_ema else 'trained'} weights)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
