#!/usr/bin/env bash
# The whole test suite, from a fresh clone: Rust formatting, lints and tests,
# then the Python package built into .venv, its quality gate (ruff, mypy,
# stubtest) and its pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
RUSTDOCFLAGS="-D warnings" cargo doc -p loaderx --no-deps -q

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --release -q
# Python quality gate (configured in pyproject.toml): lint, formatting, strict
# typing, and the hand-written _native.pyi against the compiled module.
.venv/bin/ruff check python/loaderx
.venv/bin/ruff format --check python/loaderx
.venv/bin/python -m mypy
.venv/bin/python -m mypy.stubtest loaderx._native
# The object-storage tests start a real S3 server (SeaweedFS, from
# requirements-dev.txt) on 127.0.0.1; here it is required, never skipped.
LOADERX_REQUIRE_S3="${LOADERX_REQUIRE_S3:-1}" .venv/bin/python -m pytest "$@"
