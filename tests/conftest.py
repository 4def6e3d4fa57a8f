"""Shared fixtures for the loaderx test suite."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The session's S3 server (SeaweedFS on 127.0.0.1) and a bucket per test.
pytest_plugins = ["_s3_fixtures"]

REPO_ROOT = Path(__file__).resolve().parents[1]
# shared/ sits beside the repository checkout (in CI as well as locally).
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "loaderx-2.0.0"
# Override only to test the bootstrap itself; the default is the cached venv.
REFERENCE_VENV = Path(os.environ.get("LOADERX_REFERENCE_VENV", REPO_ROOT / ".venv-ref"))


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not (FIXTURES / "manifest.json").is_file():
        msg = f"reference fixtures not found at {FIXTURES}"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return FIXTURES


@pytest.fixture
def store_path(tmp_path) -> Path:
    """A path (not yet existing) for a new store."""
    return tmp_path / "store"


@pytest.fixture
def store_paths(tmp_path):
    """Factory of fresh, distinct, not-yet-existing store paths."""
    counter = iter(range(10**9))

    def make(name: str = "s") -> Path:
        return tmp_path / f"{name}_{next(counter)}"

    return make


def _load_reference_env_module():
    script = REPO_ROOT / "scripts" / "reference_env.py"
    spec = importlib.util.spec_from_file_location("_loaderx_reference_env", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def reference_env():
    """The helper module that builds and drives the reference loaderx 2.0.0 venv."""
    return _load_reference_env_module()


@pytest.fixture(scope="session")
def reference_python(reference_env) -> Path:
    """Interpreter of a separate venv holding the published loaderx==2.0.0.

    Built once into ``<repo>/.venv-ref`` and reused.  When it cannot be built
    (e.g. PyPI unreachable) the dependent tests fail in CI and skip elsewhere.
    """
    try:
        return reference_env.ensure_reference_python(REFERENCE_VENV)
    except (reference_env.ReferenceEnvError, subprocess.TimeoutExpired, OSError) as exc:
        msg = f"reference loaderx 2.0.0 environment unavailable: {exc}"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def run_reference(reference_python, reference_env):
    """Run a Python script file with the reference interpreter (isolated mode)."""

    def run(script: Path, *args, timeout: float = 120, check: bool = True):
        proc = subprocess.run(
            [str(reference_python), "-I", str(script), *map(str, args)],
            capture_output=True, text=True, timeout=timeout,
            env=reference_env.clean_env(), cwd=str(Path(script).parent))
        if check and proc.returncode != 0:
            raise AssertionError(
                f"reference script failed ({proc.returncode}):\n"
                f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
        return proc

    return run


def loaderx_child_env() -> dict:
    """Environment for a child ``sys.executable`` that must import the same
    loaderx as this test process."""
    import loaderx

    pkg_parent = str(Path(loaderx.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.fixture(scope="session")
def run_ours():
    """Run ``code`` in a child of this interpreter that imports our loaderx."""

    def run(code: str, *args, timeout: float = 120, cwd=None):
        return subprocess.run([sys.executable, "-c", code, *map(str, args)],
                              capture_output=True, text=True, timeout=timeout,
                              env=loaderx_child_env(), cwd=cwd)

    return run
