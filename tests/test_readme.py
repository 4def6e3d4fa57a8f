"""The README's object-storage example runs as written, against the test S3
server (only the endpoint and keys are swapped for the server's), and its
captured demo output is what `loaderx demo` prints (numbers aside)."""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

from loaderx import tools

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_after(heading: str) -> str:
    section = README.read_text().split(heading, 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_beyond_one_machine_example(s3_server):
    code = _block_after("### Beyond one machine")
    for placeholder, value in (("http://127.0.0.1:8333", s3_server.endpoint),
                               ('"aws_access_key_id": "..."', f'"aws_access_key_id": "{s3_server.access_key}"'),
                               ('"aws_secret_access_key": "..."',
                                f'"aws_secret_access_key": "{s3_server.secret_key}"')):
        assert placeholder in code, placeholder
        code = code.replace(placeholder, value)
    s3_server.create_bucket("bucket")
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    batch = scope["batch"]
    assert batch["images"].shape == (64, 3, 64, 64)
    assert len(set(batch["labels"].tolist())) == 64  # cyclic: no repeats within a batch
    assert [s["records"] for s in scope["streams"]["labels"].shards] == [256, 256, 256, 232]


def _shape_of(text: str) -> list[str]:
    """Lines with every number, the demo's folder and the spacing made
    generic: what stays is the wording, which must not drift."""
    out = []
    for line in text.strip().splitlines():
        line = re.sub(r"/\S*loaderx-demo-\S+", "DIR", line)
        line = re.sub(r"\d[\d,.]*", "N", line)
        line = re.sub(r"N (B|KiB|MiB|GiB)\b", "N SIZE", line)  # sizes change unit with --records
        out.append(" ".join(line.split()))
    return out


def test_demo_output_in_readme_is_what_the_demo_prints():
    block = README.read_text().split("### What the demo prints", 1)[1]
    shown = block.split("```text", 1)[1].split("```", 1)[0]
    buf = io.StringIO()
    tools.demo(records=512, steps=60, batch_size=64, out=buf)  # a smaller run: same lines
    assert _shape_of(shown) == _shape_of(buf.getvalue())
    assert "8,192 generated records" in shown and "3 rounds of 500 batches" in shown  # the default run


def test_image_dataset_example(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(2)
    pixels = [rng.integers(0, 256, size=(8 + i % 5, 6, 3), dtype=np.uint8) for i in range(40)]
    files = []
    for p in pixels:
        buf = io.BytesIO()
        image.fromarray(p).save(buf, format="PNG")
        files.append({"bytes": buf.getvalue(), "path": None})
    labels = [i % 3 for i in range(40)]
    datasets.Dataset.from_dict(
        {"image": files, "label": labels},
        features=datasets.Features({"image": datasets.Image(),
                                    "label": datasets.ClassLabel(names=["cat", "dog", "fox"])}),
    ).save_to_disk(str(tmp_path / "hf_saved"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_block_after("### An image dataset, end to end"), str(README), "exec"), scope)
    batch = scope["batch"]
    assert scope["names"] == ["cat", "dog", "fox"]
    assert batch["label"].dtype == np.int64 and batch["label"].shape == (32,)
    assert len(batch["image"]) == 32
    for img, label in zip(batch["image"], batch["label"].tolist(), strict=True):
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
        # decoded exactly (PNG), and the label beside it is that image's
        assert any(np.array_equal(img, p) for p, lab in zip(pixels, labels, strict=True) if lab == label)
    for s in scope["streams"].values():
        s.close()
