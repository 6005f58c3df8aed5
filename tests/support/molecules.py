"""A stand-in for the molsets wheel: a zip with MOSES's two CSV members, holding the given SMILES."""

from __future__ import annotations

import csv
import gzip
import io
import zipfile


def fake_molsets_wheel(path, train, test):
    """Write `path` (a `molsets-*.whl` name) with `train` and `test` as its MOSES sets; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for member, rows in (("moses/dataset/data/train.csv.gz", train), ("moses/dataset/data/test.csv.gz", test)):
            buffer = io.StringIO()
            writer = csv.writer(buffer)
            writer.writerow(["SMILES", "SPLIT"])
            writer.writerows([s, "x"] for s in rows)
            archive.writestr(member, gzip.compress(buffer.getvalue().encode()))
    return path
