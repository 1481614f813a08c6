#!/usr/bin/env bash
# The project's one test command (README): formatting, lints, docs, every Rust test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:--D warnings}"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc"
cargo doc --workspace --no-deps --locked --quiet
echo "== cargo test"
cargo test --workspace --locked
