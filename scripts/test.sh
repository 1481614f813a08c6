#!/usr/bin/env bash
# The project's one test command (README): formatting, lints, docs, every Rust test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:--D warnings}"

# Video (the cargo feature `video`) links the system's FFmpeg libraries: built and tested
# wherever their development files are installed (.ci/run installs them), skipped otherwise.
FEATURES=()
# The feature needs FFmpeg's development files and libclang (bindgen loads it to make the
# bindings; libclang-cpp is another library).
if pkg-config --exists libavcodec libavformat libswscale 2>/dev/null \
  && /sbin/ldconfig -p 2>/dev/null | grep -qE "libclang(-[0-9]+)?\.so"; then
  FEATURES=(--features chute-cli/video,chute-python/video)
  export MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:---features video}"
  echo "== video: FFmpeg $(pkg-config --modversion libavcodec) found; building with the feature video"
else
  echo "== video: no FFmpeg development files (pkg-config libavcodec) or no libclang; building without video (its tests skip)"
fi

echo "== layers (cargo tree)"
./scripts/check-layers.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked "${FEATURES[@]}" -- -D warnings
echo "== cargo doc"
cargo doc --workspace --no-deps --locked --quiet "${FEATURES[@]}"
# CHUTE_TEST_SERVERS=1 (set by .ci/run): start the servers the remote-storage tests read
# from, on 127.0.0.1 only, until this script exits: nginx (must be installed; .ci/run
# installs the Debian package), moto's S3 server and the GCS emulator (pip, into the venv),
# Azurite when installed (.ci/run installs it with npm) and chute's fault proxy
# (scripts/faultproxy.py). Without them those tests skip, saying so.
PYTHON="${PYTHON:-python3}"
if [ "${CHUTE_TEST_SERVERS:-0}" = 1 ]; then
  echo "== test servers"
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "moto[server]" \
    gcp-storage-emulator azure-storage-blob
  VENV_PY="$PWD/.venv/bin/python"
  # shellcheck source=scripts/servers.sh
  source scripts/servers.sh
else
  echo "== no test servers (CHUTE_TEST_SERVERS unset): the remote-storage tests (nginx, S3, fault proxy) skip"
fi

echo "== cargo test"
cargo test --workspace --locked "${FEATURES[@]}"

# CHUTE_TEST_FUZZ=1 (set by .ci/run): build the cargo-fuzz targets (every parser of untrusted
# bytes: FUZZING.md lists them and the campaign's figures) on the stable toolchain (`-s none`:
# coverage without a sanitizer), and give each a short smoke run that starts from its seed
# corpus in fuzz/seeds/ (the campaign's, minimized; new inputs go to the ignored fuzz/corpus/).
if [ "${CHUTE_TEST_FUZZ:-0}" = 1 ]; then
  echo "== fuzz targets"
  command -v cargo-fuzz >/dev/null || cargo install --quiet --locked cargo-fuzz
  (
    cargo fuzz build -s none
    for target in $(cargo fuzz list); do
      mkdir -p "fuzz/corpus/$target"
      cargo fuzz run -s none "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -runs=200000 -max_total_time=60 -max_len=4096 2>&1 | tail -n 1
    done
  )
  # CI (CHUTE_CI=1, .ci/run): the fuzz build is not needed again; free its disk for the venv.
  if [ "${CHUTE_CI:-0}" = 1 ]; then rm -rf fuzz/target; fi
fi

# The Python package: build and install it the way users do (pip install . builds the
# extension with maturin, fetched by pip's build isolation), then run its tests. The venv is
# kept between runs; cargo's target/ is shared with the steps above.
echo "== python: pip install . into .venv"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# jax (CPU, ~100 MB) for the JAX DLPack test; mypy for the stub check; webdataset, pyarrow and
# Hugging Face datasets write the files the interop tests read; soundfile (libsndfile) and av
# (PyAV: FFmpeg with libopus and libmp3lame) write and decode the audio tests' files, soxr
# resamples them, kaldi-native-fbank gives reference fbank features. torch only on request
# (below): its PyPI wheel pulls ~3 GB of CUDA libraries, and without it its tests skip, saying so.
.venv/bin/python -m pip install --quiet --disable-pip-version-check numpy pytest jax mypy \
  webdataset pyarrow pillow datasets tokenizers transformers soundfile soxr av kaldi-native-fbank \
  msgpack
# CHUTE_TEST_TORCH=1 (set by .ci/run) also installs torch so its tests run (DataLoader,
# from_dlpack, Stateful). Best effort: if the ~3 GB download fails, those tests skip and say so.
if [ "${CHUTE_TEST_TORCH:-0}" = 1 ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check torch \
    || echo "warning: torch did not install; the torch tests will skip"
fi
# Lightning, Hugging Face transformers and accelerate (they need torch) for the framework
# tests: Lightning's loops and DDP launcher, Trainer's checkpoints and resume, accelerate's
# prepare and save_state. Best effort: without them those tests skip, saying so.
if [ "${CHUTE_TEST_TORCH:-0}" = 1 ] && .venv/bin/python -c "import torch" 2>/dev/null \
  && ! .venv/bin/python -c "import lightning, transformers, accelerate" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check lightning transformers \
    accelerate || echo "warning: lightning/transformers/accelerate did not install; their tests will skip"
fi
# The audio tests' references that need torch: torchaudio's Kaldi fbank and openai-whisper's
# log-mel (its audio module alone; --no-deps: neither may change the torch installed, and
# whisper's tokenizer and numba are not used). Best effort: without them those tests skip.
if [ "${CHUTE_TEST_TORCH:-0}" = 1 ] && .venv/bin/python -c "import torch" 2>/dev/null \
  && ! .venv/bin/python -c "import importlib.util as u; assert u.find_spec('torchaudio') and u.find_spec('whisper')" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps torchaudio \
    openai-whisper || echo "warning: torchaudio/openai-whisper did not install; their tests will skip"
fi
# torchcodec (it needs torch; --no-deps for the same reason), the video tests' reference
# decoder: it decodes with the system's FFmpeg libraries, as chute's video ops do.
if [ "${CHUTE_TEST_TORCH:-0}" = 1 ] && .venv/bin/python -c "import torch" 2>/dev/null \
  && ! .venv/bin/python -c "import torchcodec" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps torchcodec \
    || echo "warning: torchcodec did not install; the video tests that compare with it will skip"
fi
# Megatron-Core (it needs torch) for the byte-compatibility tests of Megatron indexed datasets.
if [ "${CHUTE_TEST_TORCH:-0}" = 1 ] && .venv/bin/python -c "import torch" 2>/dev/null \
  && ! .venv/bin/python -c "import megatron.core" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check megatron-core \
    || echo "warning: megatron-core did not install; the Megatron tests will skip"
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps .
echo "== python: pytest ($(df -h . | awk 'NR==2 {print $4}') disk free)"
# The `chute convert` interop tests run the command `cargo test` built above.
CHUTE_BIN="$PWD/target/debug/chute" .venv/bin/python -m pytest python/tests -q -rs
