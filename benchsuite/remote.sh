#!/usr/bin/env bash
# Remote-shard benchmarks, side by side in one run (figures go to BENCHMARKS.md):
#  1. the same WebDataset shards read from local disk (page cache) and streamed from a local
#     nginx (whole shards, read-ahead 2);
#  2. through chute's proxy (scripts/faultproxy.py) with no delay, and with 20 ms added to every
#     request, read-ahead 2 and 0;
#  3. a training-like pipeline (the demo's: JPEG decode + RandomResizedCrop 224 + flip) over
#     the demo's synthetic JPEG shards, from disk and from nginx.
# Each configuration runs RUNS times, interleaved; medians of samples/s are printed.
# Usage: benchsuite/remote.sh [workdir]   (needs nginx and python3)
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(realpath -m "${1:-bench-data}")"
runs="${RUNS:-5}"
mkdir -p "$work/remote"
cargo build --release --quiet -p chute-cli
chute="$PWD/target/release/chute"

# 16 shards of 200 samples, each a 128 KiB random `bin` field and a `cls`: 400 MiB.
python3 - "$work/remote" <<'PY'
import io, os, sys, tarfile
d = sys.argv[1]
for s in range(16):
    path = os.path.join(d, f"shard-{s:02d}.tar")
    if os.path.exists(path):
        continue
    with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(200):
            for field, data in (("bin", os.urandom(128 << 10)), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"s{s:02d}-{i:04d}.{field}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    os.replace(path + ".tmp", path)
PY
"$chute" index "$work/remote/shard-{00..15}.tar" > /dev/null
# The demo's synthetic 256x256 JPEGs (4,096 of them, in WebDataset shards).
if [ ! -f "$work/jpeg/done" ]; then
  rm -rf "$work/jpeg"
  "$chute" demo --images 4096 --epochs 1 --step-ms 0 --keep "$work/jpeg" --json > /dev/null
  touch "$work/jpeg/done"
fi
jpeg_names=$(cd "$work/jpeg" && ls train-*.tar)
"$chute" index "$work"/jpeg/train-*.tar > /dev/null
cat "$work"/remote/*.tar "$work"/jpeg/*.tar > /dev/null   # page cache, for nginx and local reads
ops='{"jpg": {"as": "image", "ops": [{"op": "decode"}, {"op": "random_resized_crop", "size": 224}, {"op": "horizontal_flip"}]}, "cls": [{"op": "label"}]}'

VENV_PY="$(command -v python3)" SERVERS_WWW="$work" SERVERS_S3=0 SERVERS_LATENCY_MS=20
export SERVERS_WWW SERVERS_S3 SERVERS_LATENCY_MS
# shellcheck source=scripts/servers.sh
source scripts/servers.sh

bench() { # label [args]
  local label="$1"
  shift
  "$chute" bench --shuffle block --batch-size 32 --workers 2 --json --quiet "$@" \
    | python3 -c 'import json,sys; s=json.load(sys.stdin); print(sys.argv[1], round(s["samples_per_sec"]), round(s["bytes_per_sec"]/1e6))' "$label"
}

results="$(mktemp)"
for _ in $(seq "$runs"); do
  bench local "$work/remote/shard-{00..15}.tar" >> "$results"
  bench nginx "$CHUTE_TEST_HTTP_URL/remote/shard-{00..15}.tar" >> "$results"
  bench proxy-0ms "$CHUTE_TEST_PASS_URL/remote/shard-{00..15}.tar" >> "$results"
  bench proxy-20ms "$CHUTE_TEST_LATENCY_URL/remote/shard-{00..15}.tar" >> "$results"
  bench proxy-20ms-no-read-ahead "$CHUTE_TEST_LATENCY_URL/remote/shard-{00..15}.tar" \
    --read-ahead 0 >> "$results"
  # shellcheck disable=SC2086
  bench jpeg-local $(printf "$work/jpeg/%s " $jpeg_names) --transform "$ops" >> "$results"
  # shellcheck disable=SC2086
  bench jpeg-nginx $(printf "$CHUTE_TEST_HTTP_URL/jpeg/%s " $jpeg_names) --transform "$ops" \
    >> "$results"
done
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, sps, mbps = line.split()
    rows.setdefault(label, []).append((int(sps), int(mbps)))
base = {}
print(f"{'configuration':28} {'samples/s (median)':>18} {'MB/s':>6}  runs")
for label, v in rows.items():
    sps = statistics.median(x for x, _ in v)
    mbps = statistics.median(y for _, y in v)
    print(f"{label:28} {sps:18.0f} {mbps:6.0f}  {[x for x, _ in v]}")
    base[label] = sps
print(f"nginx / local: {base['nginx'] / base['local']:.0%} (bytes only), "
      f"{base['jpeg-nginx'] / base['jpeg-local']:.0%} (JPEG decode + crop + flip)")
print(f"proxy 20 ms / proxy 0 ms: {base['proxy-20ms'] / base['proxy-0ms']:.0%} (read-ahead 2), "
      f"{base['proxy-20ms-no-read-ahead'] / base['proxy-0ms']:.0%} (read-ahead 0)")
PY
rm -f "$results"
