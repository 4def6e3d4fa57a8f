#!/usr/bin/env bash
# The whole test suite, from a fresh clone: Rust formatting, lints and tests,
# then the Python package built into .venv and its pytest suite.
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
.venv/bin/python -m pytest "$@"
