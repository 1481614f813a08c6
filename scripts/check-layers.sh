#!/usr/bin/env bash
# The layers depend one way (ARCHITECTURE.md, "Crate map"): fails when a crate reaches a
# chute crate above its layer, or when the engine or the vocabulary pull in a codec, an
# object store or libjpeg. `cargo tree` reads Cargo.lock only: nothing is built.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0

# Every package `cargo tree -p CRATE` lists (all edge kinds, as a reader would run it).
packages() {
  cargo tree --locked --all-features -p "$1" --prefix none --format '{p}' | awk '{print $1}' | sort -u
}

# check CRATE "allowed chute crates" "forbidden external crates"
check() {
  local crate=$1 allowed=$2 forbidden=$3 p list
  # A failing `cargo tree` must fail the check, not list nothing (and so pass).
  if ! list=$(packages "$crate") || [ -z "$list" ]; then
    echo "cargo tree -p $crate failed; cannot check its layer"
    exit 1
  fi
  for p in $list; do
    if [[ $p == chute* && $p != "$crate" && " $allowed " != *" $p "* ]]; then
      echo "layer violation: $crate depends on $p (allowed: ${allowed:-none})"
      failed=1
    fi
    if [[ " $forbidden " == *" $p "* ]]; then
      echo "layer violation: $crate pulls in $p"
      failed=1
    fi
  done
}

heavy="mozjpeg-sys object_store parquet arrow-array tokio png zune-jpeg fast_image_resize"
check chute-core "" "$heavy memmap2"
check chute-io "chute-core" "mozjpeg-sys parquet arrow-array png zune-jpeg fast_image_resize"
check chute-formats "chute-core chute-io" "mozjpeg-sys png zune-jpeg fast_image_resize tokenizers"
check chute-dataset "chute-core chute-io chute-formats" "mozjpeg-sys png zune-jpeg fast_image_resize tokenizers"
check chute-ops "chute-core" "object_store parquet arrow-array tokio memmap2"
check chute-pipeline "chute-core" "$heavy"

# Only the facade, the command line and the Python binding build on chute-dataset: every
# package that depends on it (`cargo tree -i`, all edge kinds) must be one of them.
if ! users=$(cargo tree --locked --all-features -i chute-dataset --prefix none --format '{p}' --edges normal,build,dev | awk '{print $1}' | sort -u) || [ -z "$users" ]; then
  echo "cargo tree -i chute-dataset failed; cannot check who depends on it"
  exit 1
fi
for p in $users; do
  if [[ " chute-dataset chute chute-cli chute-python " != *" $p "* ]]; then
    echo "layer violation: $p depends on chute-dataset (only chute, chute-cli and chute-python may)"
    failed=1
  fi
done

if [ "$failed" = 1 ]; then
  echo "see ARCHITECTURE.md: the engine depends on chute-core alone; ops and formats do not depend on each other; formats never calls the opener (chute-dataset)"
  exit 1
fi
echo "layers: one way (core <- io <- formats <- dataset; core <- ops; core <- pipeline)"
