#!/usr/bin/env bash
# Token-file benchmarks, side by side in one run (figures go to BENCHMARKS.md):
#  1. chute bench vs nanoGPT's get_batch on the same 256 MiB uint16 file (seq_len 1024,
#     batch 16, random order, int64 out), both from page cache;
#  2. peak anonymous memory (RssAnon) over a full epoch of a 4 GB token file.
# Usage: benchsuite/tokens.sh [workdir]   (needs python3; installs numpy into a venv)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-bench-data}"
mkdir -p "$work"
cargo build --release --quiet
chute=target/release/chute

if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet numpy
fi
py="$work/venv/bin/python"

small="$work/tokens-256M.bin"
[ -f "$small" ] || head -c $((256 << 20)) /dev/urandom > "$small"
cat "$small" > /dev/null   # page cache

echo "== nanoGPT get_batch"
"$py" benchsuite/nanogpt_get_batch.py "$small" --batches 3000
for w in 1 2; do
  echo "== chute bench, $w worker(s)"
  "$chute" bench "$small" --seq-len 1024 --batch-size 16 --shuffle global --out-dtype int64 \
    --workers "$w" --epochs 2 --json --quiet \
    | "$py" -c 'import json,sys; s=json.load(sys.stdin); print(json.dumps({k: s[k] for k in ("samples","batches","elapsed_secs","batches_per_sec","bytes_per_sec","wait_fraction","peak_rss_anon_mb")} | {"tokens_per_sec": s["samples_per_sec"]*1025}))'
done

big="$work/tokens-4G.bin"
[ -f "$big" ] || head -c $((4000 << 20)) /dev/urandom > "$big"
echo "== chute bench over a 4 GB token file (one epoch): peak RssAnon"
"$chute" bench "$big" --seq-len 1024 --batch-size 16 --shuffle global --workers 2 --json --quiet \
  | "$py" -c 'import json,sys; s=json.load(sys.stdin); print(json.dumps({k: s[k] for k in ("samples","elapsed_secs","bytes_per_sec","peak_rss_anon_mb")}))'
