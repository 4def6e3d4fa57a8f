"""The README's object-storage example runs as written, against the test S3
server (only the endpoint and keys are swapped for the server's)."""
from __future__ import annotations

from pathlib import Path

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
