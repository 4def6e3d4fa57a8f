"""The README's object-storage example runs as written, against the test S3
server (only the endpoint and keys are swapped for the server's), and its
captured demo output is what `loaderx demo` prints (numbers aside)."""
from __future__ import annotations

import io
import re
from pathlib import Path

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
