"""Images (issue 4): chute against PyTorch's DataLoader + webdataset + PIL + torchvision.

Data, written by the `webdataset` package with PIL (quality 90, 4:2:0): 2,048 256x256
procedurally drawn pictures (smooth blobs, gradients, stripes and sensor-like noise) with
labels in 16 shards, and 64 1024x1024 ones in one shard (plus 64 with less noise, a lower
bitrate: reduced-size decoding skips inverse DCT and colour work, not entropy decoding, so its
gain grows as the bitrate falls). Side by side in one run, median of
`--rounds` rounds, interleaved:

- decode-only, one thread: `chute bench --workers 0`, ops `decode` (the decoder's rate);
- the pipeline: decode + RandomResizedCrop(224) + horizontal flip + label, batches of 64,
  2 workers (`chute bench --workers 2`, global shuffle);
- torch: `DataLoader(wds.WebDataset(urls).decode("pil").to_tuple("jpg", "cls")
  .map_tuple(Compose([RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor()]), int),
  batch_size=64, num_workers=2)`, the same ops, uint8 out as chute's;
- 1024 -> 256: `decode` + `resize [256, 256]`, one worker, with `reduced: true` (DCT-scaled
  decode) against `reduced: false` (full-size decode, then resize).

Usage: CHUTE_BIN=target/release/chute python benchsuite/images_vs_torch.py [workdir] [rounds]
(needs torch, torchvision, webdataset, pillow, numpy). Prints JSON lines, then a markdown table.
"""
import io
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torchvision.transforms as T
import webdataset as wds
from PIL import Image

work = sys.argv[1] if len(sys.argv) > 1 else "bench-data/images"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
chute = os.environ.get("CHUTE_BIN", "target/release/chute")
N, PER_SHARD, BIG = 2048, 128, 64


def picture(rng, size, noise=6.0):
    """A smooth random scene with edges and sensor-like noise; the noise sets the bitrate."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    img = np.zeros((size, size, 3), np.float32)
    for c in range(3):
        img[..., c] = rng.uniform(40, 200) + rng.uniform(-60, 60) * x + rng.uniform(-60, 60) * y
    for _ in range(12):
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.3)
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[inside] = rng.uniform(0, 255, 3)
    stripes = (np.sin(x * rng.uniform(20, 80)) > 0) & (y < rng.uniform(0.2, 0.5))
    img[stripes] *= 0.6
    img += rng.normal(0, noise, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def jpeg(img):
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write(pattern, count, size, per_shard, seed, noise=6.0):
    if os.path.exists(pattern % 0):
        return
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i in range(count):
            sink.write({"__key__": f"{i:06d}", "jpg": jpeg(picture(rng, size, noise)),
                        "cls": str(i % 1000).encode()})


os.makedirs(work, exist_ok=True)
small = os.path.join(work, "img-%06d.tar")
big = os.path.join(work, "big-%06d.tar")
clean = os.path.join(work, "clean-%06d.tar")
write(small, N, 256, PER_SHARD, 0)
write(big, BIG, 1024, BIG, 1)
write(clean, BIG, 1024, BIG, 2, noise=1.5)
small_urls = os.path.join(work, "img-{000000..%06d}.tar" % (N // PER_SHARD - 1))
big_urls = os.path.join(work, "big-000000.tar")
clean_urls = os.path.join(work, "clean-000000.tar")
bpp = {name: 8 * sum(os.path.getsize(p) for p in paths) / pixels for name, paths, pixels in [
    ("256", [small % i for i in range(N // PER_SHARD)], N * 256 * 256),
    ("1024", [big % 0], BIG * 1024 * 1024),
    ("1024 clean", [clean % 0], BIG * 1024 * 1024)]}

DECODE = {"jpg": [{"op": "decode"}]}
PIPELINE = {"jpg": [{"op": "decode"}, {"op": "random_resized_crop", "size": 224},
                    {"op": "horizontal_flip"}], "cls": [{"op": "label"}]}
RESIZE = {"jpg": [{"op": "decode", "reduced": True}, {"op": "resize", "size": [256, 256]}]}
RESIZE_FULL = {"jpg": [{"op": "decode", "reduced": False},
                       {"op": "resize", "size": [256, 256]}]}


def chute_rate(urls, ops, workers, epochs=2):
    out = subprocess.run(
        [chute, "bench", urls, "--format", "webdataset", "--batch-size", "64",
         "--workers", str(workers), "--shuffle", "global", "--epochs", str(epochs),
         "--transform", json.dumps(ops), "--json", "--quiet"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["samples_per_sec"]


def torch_rate(epochs=2):
    ops = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = (wds.WebDataset(small_urls, shardshuffle=False, empty_check=False)
          .decode("pil").to_tuple("jpg", "cls").map_tuple(ops, int))
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2)
    start, images = time.perf_counter(), 0
    for _ in range(epochs):
        for x, _y in loader:
            images += x.shape[0]
    return images / (time.perf_counter() - start)


cases = {
    "chute decode only, 1 thread": lambda: chute_rate(small_urls, DECODE, 0),
    "chute decode+RRC224+flip, 2 workers": lambda: chute_rate(small_urls, PIPELINE, 2),
    "torch DataLoader(2)+webdataset+PIL+torchvision": torch_rate,
    "1024->256 reduced-size decode, 1 worker": lambda: chute_rate(big_urls, RESIZE, 1, 4),
    "1024->256 full decode + resize, 1 worker": lambda: chute_rate(big_urls, RESIZE_FULL, 1, 4),
    "clean 1024->256 reduced-size decode": lambda: chute_rate(clean_urls, RESIZE, 1, 4),
    "clean 1024->256 full decode + resize": lambda: chute_rate(clean_urls, RESIZE_FULL, 1, 4),
}
results = {name: [] for name in cases}
for _ in range(rounds):
    for name, run in cases.items():
        results[name].append(run())
median = {name: statistics.median(v) for name, v in results.items()}
for name, v in results.items():
    print(json.dumps({"case": name, "images_per_s": v, "median": median[name]}))

decode1 = median["chute decode only, 1 thread"]
pipe = median["chute decode+RRC224+flip, 2 workers"]
torch_ = median["torch DataLoader(2)+webdataset+PIL+torchvision"]
reduced = median["1024->256 reduced-size decode, 1 worker"]
full = median["1024->256 full decode + resize, 1 worker"]
clean_reduced = median["clean 1024->256 reduced-size decode"]
clean_full = median["clean 1024->256 full decode + resize"]
print(f"\nbits per pixel: 256x256 {bpp['256']:.2f}, 1024x1024 {bpp['1024']:.2f}, "
      f"1024x1024 clean {bpp['1024 clean']:.2f}; "
      f"torch {torch.__version__}, medians of {rounds} rounds\n")
print("| case | images/s | ratio |")
print("| --- | --- | --- |")
print(f"| chute decode only, 1 thread | {decode1:,.0f} | |")
print(f"| chute decode + RRC(224) + flip, batch 64, 2 workers | {pipe:,.0f} | "
      f"{pipe / (2 * decode1):.2f} of 2x decode-only (target >= 0.90) |")
print(f"| torch DataLoader(num_workers=2) + webdataset + PIL + torchvision | {torch_:,.0f} | "
      f"chute {pipe / torch_:.2f}x (target >= 1.5x) |")
print(f"| 1024->256, full decode + resize | {full:,.0f} | |")
print(f"| 1024->256, reduced-size decode | {reduced:,.0f} | {reduced / full:.2f}x "
      f"(target >= 2x) |")
print(f"| 1024->256 clean, full decode + resize | {clean_full:,.0f} | |")
print(f"| 1024->256 clean, reduced-size decode | {clean_reduced:,.0f} | "
      f"{clean_reduced / clean_full:.2f}x (target >= 2x) |")
