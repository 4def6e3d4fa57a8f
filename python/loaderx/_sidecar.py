"""The ``features.json`` sidecar: what a converted store's records mean.

``loaderx convert`` writes it beside the store files (a store set: at the
set's root, beside ``manifest.json``) once the store is committed. It records
the source column's type (its Arrow or NumPy type and, for Hugging Face
datasets, the feature, with the class names of a ``ClassLabel``), what each
record holds (numbers, or the exact bytes of an encoded image, a text...) and
how the codec was chosen. No reader needs it: loaderx 2.0.0 and every store
reader ignore files they do not know, so the store stays a plain store.
See docs/format.md for its fields.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

#: The sidecar's file name. No store file, no manifest and no shard name a
#: writer of ours gives can be this name.
FEATURES_FILE = "features.json"
#: The ``format`` field, and the only ``version`` this package reads.
FORMAT = "loaderx.features"
VERSION = 1


class SidecarError(ValueError):
    """A ``features.json`` that is not one this package wrote (or damaged)."""


def _local_dir(path: str | os.PathLike[str]) -> pathlib.Path | None:
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        return None  # object storage: the sidecar is not uploaded (docs/format.md)
    return pathlib.Path(text)


def read(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar of the store (or store set) at ``path`` as a dict, without
    its ``format`` and ``version`` fields; None when there is none or the
    store is in object storage. Raises :class:`SidecarError` for a file that
    is not a version-1 sidecar."""
    d = _local_dir(path)
    if d is None:
        return None
    p = d / FEATURES_FILE
    try:
        text = p.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SidecarError(f"{p} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SidecarError(f"{p} is not a loaderx features sidecar (no format {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise SidecarError(f"{p} has version {doc.get('version')!r}; this package reads version {VERSION}")
    return {k: v for k, v in doc.items() if k not in ("format", "version")}


def write(path: str | os.PathLike[str], fields: dict[str, Any]) -> None:
    """Writes the sidecar of the committed local store at ``path``: a
    temporary file renamed into place, so a reader sees all of it or none."""
    d = _local_dir(path)
    if d is None:
        raise ValueError(f"{os.fspath(path)}: features sidecars are written to local stores only")
    doc = {"format": FORMAT, "version": VERSION, **fields}
    tmp = d / f".{FEATURES_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, d / FEATURES_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def class_names(feature: Any) -> list[str] | None:
    """The class names of a Hugging Face feature as ``datasets`` serialises
    it: a ``ClassLabel``'s, or those of the ``ClassLabel`` a sequence/list
    feature holds; None for any other feature."""
    while isinstance(feature, dict):
        if feature.get("_type") == "ClassLabel":
            names = feature.get("names")
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return list(names)
            return None
        if feature.get("_type") in ("Sequence", "List", "LargeList"):
            feature = feature.get("feature")
            continue
        return None
    if isinstance(feature, list) and len(feature) == 1:  # datasets' [feature] shorthand of a list
        return class_names(feature[0])
    return None
