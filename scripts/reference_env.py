#!/usr/bin/env python3
"""Build (once) and locate the *reference* loaderx 2.0.0 environment.

The interop tests compare this project against the published ``loaderx==2.0.0``
wheel from PyPI.  Both packages import as ``loaderx``, so the reference must
live in its own virtual environment and is only ever driven through
subprocesses; it is never installed into the environment under test.

The environment is cached at ``<repo>/.venv-ref/`` (gitignored).  A marker file
is written only after the install has been verified, so an interrupted build
is detected and redone on the next run.

Command line::

    python scripts/reference_env.py            # build if needed, print python path
    python scripts/reference_env.py --rebuild  # throw the cache away first
    python scripts/reference_env.py --venv /tmp/somewhere
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REFERENCE_REQUIREMENT = "loaderx==2.0.0"
REFERENCE_VERSION = "2.0.0"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO_ROOT / ".venv-ref"
MARKER_NAME = ".loaderx-reference-ready"
INSTALL_TIMEOUT_S = 600


class ReferenceEnvError(RuntimeError):
    """The reference environment could not be created or verified."""


def venv_python(venv: Path) -> Path:
    if os.name == "nt":  # pragma: no cover - the project targets POSIX
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def clean_env() -> dict:
    """Environment for running the reference interpreter.

    Drops everything that could make the reference interpreter import the
    package under test (or anything else from the outer environment).
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env["PIP_NO_INPUT"] = "1"
    return env


_PROBE = (
    "import json, sys, loaderx, numpy, loaderx.zrecord, loaderx.utils;"
    "print(json.dumps({'version': loaderx.__version__, 'file': loaderx.__file__,"
    " 'prefix': sys.prefix, 'numpy': numpy.__version__}))"
)


def probe(python: Path) -> dict:
    """Import the reference package with ``python`` and describe it."""
    proc = subprocess.run([str(python), "-I", "-c", _PROBE], capture_output=True,
                          text=True, env=clean_env(), timeout=120)
    if proc.returncode != 0:
        raise ReferenceEnvError(f"reference import failed:\n{proc.stdout}\n{proc.stderr}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if info["version"] != REFERENCE_VERSION:
        raise ReferenceEnvError(f"expected loaderx {REFERENCE_VERSION}, got {info['version']}")
    prefix = Path(info["prefix"]).resolve()
    if not Path(info["file"]).resolve().is_relative_to(prefix):
        raise ReferenceEnvError(f"reference loaderx imported from outside its venv: {info['file']}")
    return info


def _run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          env=clean_env(), **kw)
    if proc.returncode != 0:
        raise ReferenceEnvError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _create_venv(venv: Path) -> None:
    base = getattr(sys, "_base_executable", None) or sys.executable
    try:
        _run([base, "-m", "venv", venv], timeout=300)
        _run([venv_python(venv), "-m", "pip", "--version"], timeout=120)
        have_pip = True
    except ReferenceEnvError:
        # No ensurepip for this interpreter: fall back to uv if it is around.
        if shutil.which("uv") is None:
            raise
        shutil.rmtree(venv, ignore_errors=True)
        have_pip = False
    if have_pip:
        _run([venv_python(venv), "-m", "pip", "install", "--quiet", REFERENCE_REQUIREMENT],
             timeout=INSTALL_TIMEOUT_S)
    else:
        uv = shutil.which("uv")
        _run([uv, "venv", "--quiet", "--python", base, venv], timeout=300)
        _run([uv, "pip", "install", "--quiet", "--python", venv_python(venv),
              REFERENCE_REQUIREMENT], timeout=INSTALL_TIMEOUT_S)


def ensure_reference_python(venv: Path | str = DEFAULT_VENV, rebuild: bool = False) -> Path:
    """Return the interpreter of a verified loaderx 2.0.0 venv, building it if needed."""
    venv = Path(venv).resolve()
    venv.parent.mkdir(parents=True, exist_ok=True)
    # The lock lives outside the repository so it never shows up in git status.
    tag = hashlib.sha256(str(venv).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"loaderx-reference-env-{tag}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test sessions build it once
        marker = venv / MARKER_NAME
        python = venv_python(venv)
        if not rebuild and marker.is_file() and python.exists():
            try:
                probe(python)
                return python
            except (ReferenceEnvError, subprocess.TimeoutExpired, ValueError, OSError):
                pass  # stale or broken cache: rebuild below
        shutil.rmtree(venv, ignore_errors=True)
        try:
            _create_venv(venv)
            info = probe(python)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        marker.write_text(json.dumps(info) + "\n")
        return python


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(DEFAULT_VENV))
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args(argv)
    try:
        python = ensure_reference_python(args.venv, rebuild=args.rebuild)
    except (ReferenceEnvError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"reference environment unavailable: {exc}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
