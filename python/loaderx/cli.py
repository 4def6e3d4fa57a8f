"""The ``loaderx`` command line (also ``python -m loaderx``).

Subcommands: ``demo``, ``info``, ``verify``, ``convert``; each has ``--help``.
They call :mod:`loaderx.tools`. Exit status: 0 on success, 1 when a store is
unsound or an operation fails, 2 for a usage error, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]

_EXIT_FAIL = 1


def _fmt_bytes(n: float) -> str:
    from loaderx.tools import _fmt_bytes as fmt

    return fmt(n)


def _err(cmd: str, message: str) -> None:
    print(f"loaderx {cmd}: error: {message}", file=sys.stderr)


def _message(e: BaseException) -> str:
    text = str(e)
    if isinstance(e, KeyError) and e.args:
        text = str(e.args[0])
    return text or type(e).__name__


# -- info -------------------------------------------------------------------


def _format_text(d: dict[str, Any]) -> str:
    """The on-disk layout line: which releases write it, and whether it is ours."""
    text = f"loaderx {d['layout']} layout (written by {d['layout_releases']}"
    if d["layout"] == "2.0.0":
        return text + " and this package)"
    return text + "; read-only here, `loaderx convert` rewrites it as 2.0.0)"


#: What a record holds, by the sidecar's ``content``, in words.
_CONTENT_TEXT = {
    "values": "values",
    "bytes": "bytes, untouched (uint8)",
    "text": "text, its UTF-8 bytes (uint8)",
    "encoded image": "an encoded image file's bytes (uint8); decode with loaderx.tools.decode_images",
    "encoded audio": "an encoded audio file's bytes (uint8)",
    "encoded video": "an encoded video file's bytes (uint8)",
    "encoded document": "an encoded document file's bytes (uint8)",
}


def _codec_rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    """The codec, and how ``convert --codec auto`` chose it (from the sidecar)."""
    choice = (d.get("features") or {}).get("codec")
    if not isinstance(choice, dict) or choice.get("requested") != "auto":
        return [("codec", str(d["codec"]))]
    estimates = choice.get("estimates") or {}
    measured = ", ".join(f"{c} {r:.2f}x" for c, r in estimates.items() if isinstance(r, (int, float)))
    return [
        ("codec", f"{d['codec']}, chosen by convert --codec auto: {choice.get('reason')}"),
        (
            "measured",
            f"on {choice.get('sample_records', 0):,} sampled records, the store's estimated size "
            f"as a ratio to raw: {measured}",
        ),
    ]


def _feature_rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    f = d.get("features")
    if not f:
        return []
    if "error" in f:
        return [("features", f"unreadable: {f['error']}")]
    rows = []
    if f.get("column") is not None or f.get("source_type") is not None:
        source = f"{f.get('column') or '-'}" + (f" ({f['source_type']})" if f.get("source_type") else "")
        rows.append(("source", source))
    feature = f.get("feature")
    names = f.get("names")
    if isinstance(names, list):
        shown = ", ".join(f"{i}={n}" for i, n in enumerate(names[:10]))
        more = f", ... ({len(names) - 10} more)" if len(names) > 10 else ""
        rows.append(("classes", f"{len(names):,} names: {shown}{more}"))
    elif isinstance(feature, dict):
        rows.append(("feature", str(feature.get("_type", feature))))
    content = f.get("content")
    if content == "decoded image":
        rows.append(("content", f"an image decoded to uint8 (H, W, C), mode {f.get('image_mode')}"))
    elif content is not None:
        rows.append(("content", _CONTENT_TEXT.get(content, str(content))))
    return rows


def _print_info(d: dict[str, Any]) -> None:
    shape = str(tuple(d["item_shape"])) if d["item_shape"] is not None else "- (each record has its own)"
    ratio = f"{d['ratio']:.2f}x" if d["ratio"] is not None else "-"
    dict_text = _fmt_bytes(d["dict_bytes"]) if d["dict_bytes"] else "none"
    print(d["path"])
    for label, value in (
        ("kind", d["kind"]),
        ("dtype", d["dtype"]),
        ("item_shape", shape),
        *_codec_rows(d),
        ("layout", f"store set of {d['shards']:,} shards" if d["shards"] else "one store"),
        ("format", _format_text(d)),
        ("records", f"{d['records']:,}"),
        ("logical", f"{_fmt_bytes(d['logical_bytes'])} ({d['logical_bytes']:,} bytes)"),
        ("on disk", f"{_fmt_bytes(d['disk_bytes'])} ({d['disk_bytes']:,} bytes)"),
        ("ratio", ratio),
        ("dictionary", dict_text),
        *_feature_rows(d),
    ):
        print(f"  {label:<11} {value}")


def _cmd_info(args: argparse.Namespace) -> int:
    from loaderx import tools

    results: list[dict[str, Any]] = []
    failed = False
    for i, path in enumerate(args.paths):
        try:
            d = tools.info(path)
        except Exception as e:
            failed = True
            if args.json:
                results.append({"path": str(path), "error": _message(e)})
            else:
                _err("info", f"{path}: {_message(e)}" if str(path) not in str(e) else _message(e))
            continue
        if args.json:
            results.append(d)
        else:
            if i:
                print()
            _print_info(d)
    if args.json:
        print(json.dumps(results, indent=2))
    return _EXIT_FAIL if failed else 0


# -- verify -----------------------------------------------------------------


_CONTENT = {"frames": "zstd frame checksums", "sidecar": "sums.zr"}


def _cmd_verify(args: argparse.Namespace) -> int:
    from loaderx import tools

    results = []
    for path in args.paths:
        r = tools.verify(path, progress=not args.quiet and not args.json)
        results.append(r)
        if args.json:
            continue
        if r.ok and r.content is not None:
            print(
                f"ok      {r.path}: {r.records:,} records ({r.kind}), every one decodes "
                f"and matches its checksum ({_CONTENT[r.content]})"
            )
        elif r.ok:
            print(
                f"ok      {r.path}: {r.records:,} records ({r.kind}), every one decodes; "
                "structure only: the store has no checksums, so its content could not be checked"
            )
        elif r.first_bad_index is not None:
            print(f"FAILED  {r.path}: record {r.first_bad_index} of {r.records:,}: {r.error}")
        else:
            text = r.error or "failed"
            print(f"FAILED  {text if text.startswith(r.path) else f'{r.path}: {text}'}")
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    elif len(results) > 1:
        bad = sum(not r.ok for r in results)
        print(f"{len(results) - bad} of {len(results)} stores sound" + (f", {bad} failed" if bad else ""))
    return 0 if all(r.ok for r in results) else _EXIT_FAIL


# -- convert ----------------------------------------------------------------


def _cmd_convert(args: argparse.Namespace) -> int:
    from loaderx import tools

    if args.chunk_records is not None and args.chunk_records < 1:
        _err("convert", f"--chunk-records must be at least 1, got {args.chunk_records}")
        return 2
    out = tools.convert(
        args.src,
        args.dst,
        codec=args.codec,
        tier=args.tier,
        key=args.key,
        columns=args.columns,
        chunk_records=args.chunk_records,
        progress=not args.quiet,
        shard_records=args.shard_records,
        shard_bytes=args.shard_bytes,
        decode_images=args.image_columns or args.decode_images,
        image_mode=args.image_mode,
        level=args.level,
    )
    if not args.quiet:
        for name, path in out.items():
            d = tools.info(path)
            shape = f" {tuple(d['item_shape'])}" if d["item_shape"] is not None else ""
            ratio = f"{d['ratio']:.2f}x" if d["ratio"] is not None else "-"
            f = d.get("features") or {}
            auto = " (auto)" if (f.get("codec") or {}).get("requested") == "auto" else ""
            extra = ""
            if f.get("content") not in (None, "values"):
                extra += f", {f['content']}"
            if isinstance(f.get("names"), list):
                extra += f", {len(f['names']):,} class names"
            print(
                f"{name} -> {path}: {d['kind']} {d['dtype']}{shape}, {d['codec']}{auto}, "
                f"{d['records']:,} records, {_fmt_bytes(d['logical_bytes'])} -> "
                f"{_fmt_bytes(d['disk_bytes'])} on disk ({ratio}){extra}"
            )
    return 0


# -- demo -------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from loaderx import tools

    report = tools.demo(
        dir=args.dir,
        records=args.records,
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        out=None if args.json else sys.stdout,
    )
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


# -- parser -----------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from loaderx import __version__
    from loaderx.tools.convert import CONVERT_CODECS
    from loaderx.zrecord import DICT_TIERS

    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="loaderx",
        description="Zrecord stores and the loaderx DataLoader: try it, inspect, check and build stores.",
        epilog="Run 'loaderx COMMAND --help' for a command's options.",
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"loaderx {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "demo",
        help="build stores from generated data and stream them through a DataLoader",
        description=(
            "Builds three stores from deterministic generated data (no downloads): 'image', "
            "Dense uint8 (3, 64, 64) with zstd; 'label', Dense int64, raw; 'tokens', Ragged "
            "int32 with zstd_dict and a dictionary from train_dict, and explains their sizes. "
            "Then streams them together through a DataLoader whose transform normalises images "
            "to float32: up to 50 warm-up batches, then three timed rounds of --steps batches "
            "(median and range reported), then the first --steps batches replayed and checked "
            "against the source records. Ends with the next commands to try."
        ),
        epilog="example:\n  loaderx demo\n  loaderx demo --dir /tmp/demo --records 20000 --steps 1000",
        formatter_class=fmt,
    )
    p.add_argument(
        "--dir",
        metavar="D",
        help="build the stores in D and keep them (default: a temporary directory, removed afterwards)",
    )
    p.add_argument(
        "--records",
        metavar="N",
        type=_positive,
        default=8192,
        help="records per store (default: %(default)s)",
    )
    p.add_argument(
        "--steps",
        metavar="S",
        type=_positive,
        default=500,
        help="loader batches per timed round, and batches checked (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        metavar="B",
        type=_positive,
        default=64,
        help="records per batch (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="data and sampling seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser(
        "info",
        help="describe stores: kind, dtype, shape, codec, records, sizes, ratio",
        description=(
            "Describes each store: kind (Dense or Ragged), dtype, item_shape, codec, on-disk "
            "format (which loaderx releases write its layout), record count, logical size (the "
            "records' uncompressed bytes), size on disk (every store file of every shard), "
            "compression ratio and dictionary size. For a store built by 'loaderx convert', also "
            "what its features.json says: the source column and type, class names, what a record "
            "holds, and how --codec auto chose the codec (with the ratios it measured)."
        ),
        epilog="example:\n  loaderx info train/image train/label\n  loaderx info --json train/*",
        formatter_class=fmt,
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="store or store-set directories, or object-storage URLs (s3://...)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list with one object per path (an 'error' object for a failed one)",
    )
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "verify",
        help="decode every record of stores and report the first bad one",
        description=(
            "Opens each store and decodes every record, in chunks; decoding checks every frame "
            "and every Ragged shape prefix against the schema. Reports the first bad record and "
            "its error per store. Exits 0 only when every store is sound."
        ),
        epilog="example:\n  loaderx verify train/image train/tokens",
        formatter_class=fmt,
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="store or store-set directories, or object-storage URLs (s3://...)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of results")
    p.add_argument("--quiet", "-q", action="store_true", help="draw no progress line")
    p.set_defaults(func=_cmd_verify)

    tiers = ", ".join(f"{k}: {v['size'] // 1024} KiB dictionary" for k, v in DICT_TIERS.items())
    p = sub.add_parser(
        "convert",
        help="build stores from .npy/.npz, Parquet, Arrow or Hugging Face datasets",
        description=(
            "Builds stores from SRC:\n"
            "  .npy          one Dense store at DST (memory-mapped, appended in chunks)\n"
            "  .npz          one Dense store per array at DST/<array> (--key K: that array into DST)\n"
            "  .parquet, .arrow, .feather, or a directory saved by datasets' save_to_disk:\n"
            "                one store per column at DST/<column>, equal record counts\n"
            "                (--key K: column K into DST; for a DatasetDict, --key picks a split,\n"
            "                else each split goes to DST/<split>/<column>)\n"
            "  a store       a copy re-encoded with --codec\n"
            "Numeric columns whose rows all have one shape (scalars, fixed-size or equal-length\n"
            "lists) become Dense stores; variable-length (nested) lists become Ragged stores.\n"
            "Binary and string columns, Hugging Face Image()/Audio() columns and 1-D NumPy S/U\n"
            "arrays become Ragged uint8 stores of each row's bytes, untouched (UTF-8 for text);\n"
            "--decode-images (or --image-columns a,b) decodes image columns to uint8 (H, W, C)\n"
            "records instead.\n"
            "Structs, nulls and other types are errors unless --columns leaves them out.\n"
            "--codec auto (the default) measures raw, zstd and zstd_dict on a sample of each\n"
            "column and keeps raw unless compression shrinks the store by 10% or more.\n"
            "Each store gets a features.json (source type, class names, codec choice) that\n"
            "'loaderx info' shows; loaderx 2.0.0 ignores it.\n"
            "Parquet, Arrow and datasets need: pip install 'loaderx[convert]';\n"
            "--decode-images needs: pip install 'loaderx[images]'"
        ),
        epilog="example:\n  loaderx convert images.npy train/image\n"
        "  loaderx convert train.parquet train --columns image,label\n"
        "  loaderx convert hf_dataset/ train --decode-images --codec zstd",
        formatter_class=fmt,
    )
    p.add_argument("src", metavar="SRC", help="source file or directory")
    p.add_argument("dst", metavar="DST", help="new store directory (or parent of one store per column)")
    p.add_argument(
        "--codec",
        choices=CONVERT_CODECS,
        default="auto",
        help="store codec; auto measures which one pays, per store (default: %(default)s)",
    )
    p.add_argument(
        "--tier",
        choices=list(DICT_TIERS),
        default="balanced",
        help=f"zstd_dict dictionary tier ({tiers}; default: %(default)s)",
    )
    p.add_argument("--key", metavar="K", help="one .npz array, one column, or one DatasetDict split")
    p.add_argument("--columns", metavar="a,b", help="comma-separated columns (or .npz arrays) to convert")
    p.add_argument(
        "--chunk-records",
        metavar="N",
        type=int,
        default=None,
        help="records per append (default: about 32 MiB of data)",
    )
    p.add_argument(
        "--shard-records",
        metavar="N",
        type=_positive,
        default=None,
        help="write each store as a store set of shards of N records",
    )
    p.add_argument(
        "--shard-bytes",
        metavar="N",
        type=_positive,
        default=None,
        help="write each store as a store set of shards of about N payload bytes",
    )
    p.add_argument(
        "--decode-images",
        action="store_true",
        help="decode every Hugging Face Image() column with Pillow into uint8 (H, W, C) records",
    )
    p.add_argument(
        "--image-columns",
        metavar="a,b",
        help="decode these columns of encoded images (any binary column) instead; implies --decode-images",
    )
    p.add_argument(
        "--image-mode",
        metavar="MODE",
        default="RGB",
        help="Pillow mode decoded images are converted to: RGB, L (C = 1), RGBA... (default: %(default)s)",
    )
    p.add_argument(
        "--level",
        metavar="N",
        type=int,
        default=None,
        help="zstd compression level, negative ones included (default: 3 for zstd, 19 for zstd_dict)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line and no summary")
    p.set_defaults(func=_cmd_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = args.func(args)
        return status
    except KeyboardInterrupt:
        print(file=sys.stderr)
        _err(args.command, "interrupted")
        return 130
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): stop quietly.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return _EXIT_FAIL
    except (OSError, ValueError, TypeError, ImportError, RuntimeError, MemoryError) as e:
        _err(args.command, _message(e))
        return _EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
