"""docs/frameworks.md's PyTorch examples run as written: the DDP loop under
torchrun on two CPU ranks, then resumed from its checkpoint on one rank, and
the torch.utils.data.DataLoader snippets."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[1] / "docs" / "frameworks.md"


def _block_after(heading: str) -> str:
    section = DOC.read_text().split(heading, 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def _torchrun(script: Path, ranks: int) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(script)],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_ddp_loop_trains_and_resumes_on_another_world_size(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_block_after("### A DistributedDataParallel loop"))
    first = _torchrun(script, 2)
    assert "step 200: loss" in first, first
    loss = float(first.split("loss")[1])
    assert loss < 0.05, first  # a linear target: SGD gets close in 200 steps
    assert torch.load(tmp_path / "ddp-ckpt.pt")["loader"] == {"step": 200}
    second = _torchrun(script, 1)
    assert "step 400: loss" in second, second
    assert float(second.split("loss")[1]) < 1e-6


def test_torch_dataloader_snippets(tmp_path, monkeypatch):
    import numpy as np

    from loaderx.zrecord import Dense

    monkeypatch.chdir(tmp_path)
    with Dense.create("x", np.float32, (4,)) as w:
        w.append(np.arange(2048 * 4, dtype=np.float32).reshape(2048, 4))
    streams = {"x": Dense.open("x")}
    scope: dict = {"streams": streams}
    exec(compile(_block_after("### Under `torch.utils.data.DataLoader`"), str(DOC), "exec"), scope)
    first = next(iter(scope["batches"]))["x"]
    assert first.shape == (256, 4) and first.dtype == torch.float32
    rows = (first[:, 0] / 4).long()
    assert torch.equal(first, torch.stack([torch.arange(4.0) + 4 * r for r in rows]))
    seen = [b["x"].shape for b, _ in zip(scope["steps"], range(3))]
    assert seen == [(256, 4)] * 3
