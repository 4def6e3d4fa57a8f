"""A store keeps working in a forked child (e.g. a forking data-loader worker)."""

import os
import signal
import time

import numpy as np
import pytest

from loaderx.zrecord import Dense, Ragged

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

IMAGES = np.random.default_rng(1).integers(0, 255, size=(64, 3, 64, 64), dtype=np.uint8)


def _wait(pid, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_gathers_after_fork(tmp_path, codec):
    with Dense.create(tmp_path / "d", np.uint8, (3, 64, 64), codec=codec) as w:
        w.append(IMAGES)
    with Ragged.create(tmp_path / "r", np.uint8, codec=codec) as w:
        w.append(list(IMAGES))
    d = Dense.open(tmp_path / "d")
    r = Ragged.open(tmp_path / "r")
    # Large gathers start the native worker pool in the parent first.
    np.testing.assert_array_equal(d[:], IMAGES)
    assert len(r[:]) == 64
    pid = os.fork()
    if pid == 0:  # child: the parent's pool threads do not exist here
        code = 1
        try:
            ok = np.array_equal(d[::-1], IMAGES[::-1])
            ok = ok and all(np.array_equal(a, b) for a, b in zip(r[list(range(64))], IMAGES))
            code = 0 if ok else 2
        finally:
            os._exit(code)
    assert _wait(pid) == 0
    np.testing.assert_array_equal(d[[5, 1]], IMAGES[[5, 1]])
    d.close()
    r.close()
