"""The seed document's pattern: your own map-style Dataset under chute.Loader (worker threads,
and worker processes with worker_mode="process") vs torch's DataLoader (worker processes),
side by side, same dataset object.

    python benchsuite/own_dataset_vs_dataloader.py [--images 1500] [--epochs 2] [--workers 2]
    python benchsuite/own_dataset_vs_dataloader.py --only python --scaling 1,2

`--scaling` runs DataLoader and chute's process mode at each worker count listed (the
scaling curve) instead of the fixed cases. `--fresh` runs each case in a fresh interpreter
(as a training job runs its loader): its memory then holds nothing the cases before it left.

Datasets (all in one run): `imagefolder` (__getitem__ reads a JPEG file, decodes it with PIL,
crops 224 at a random place, flips half the time: the ImageFolder shape), `bytes` (torch's
loaders on that dataset, chute on one whose __getitem__ returns the file's bytes, decoded,
cropped 224 at a random place and flipped by chute's native ops), `trivial` (a small
numpy array per index) and `python` (a __getitem__ of pure-Python work that holds the GIL).
Reports images (samples) per second over all epochs from the loader's making (page cache warm:
the files are read right before each run), the same after the first batch (steady state),
time to the first batch, peak RSS summed over the process tree and peak PSS (what
the processes really cost together: shared pages counted once). Needs torch, numpy, pillow.
"""

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def tree_pids(pid):
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out.extend(tree_pids(int(child)))
    except OSError:
        pass
    return out


def memory(pids):
    rss = pss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return rss * 1024, pss * 1024


class Peak:
    """Samples the process tree's RSS and PSS every 100 ms (reading smaps costs CPU)."""

    def __init__(self):
        self.rss = self.pss = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            rss, pss = memory(tree_pids(os.getpid()))
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            time.sleep(0.1)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


class ImageFolder:
    """What a team's own Dataset looks like: files on disk, PIL, a random crop and a flip."""

    def __init__(self, root):
        self.files = sorted(Path(root).glob("*/*.jpg"))
        self.classes = sorted({p.parent.name for p in self.files})

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        path = self.files[i]
        rng = np.random.default_rng(i)
        with Image.open(path) as img:
            img = img.convert("RGB")
            w, h = img.size
            x, y = int(rng.integers(0, w - 224 + 1)), int(rng.integers(0, h - 224 + 1))
            img = img.crop((x, y, x + 224, y + 224))
            if rng.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            return np.asarray(img), self.classes.index(path.parent.name)


class ImageBytes(ImageFolder):
    """The same folder, but `__getitem__` returns the encoded file and its label: chute's
    native ops decode, crop and flip it (without the GIL); torch's loaders get the PIL
    dataset above, which does that work in `__getitem__`."""

    def __getitem__(self, i):
        path = self.files[i]
        return {"jpg": path.read_bytes(), "cls": self.classes.index(path.parent.name)}


# The PIL dataset's work, natively: a 224x224 crop at a random place (RandomResizedCrop
# with the area and aspect of such a crop of a 320x288 image, so it resizes nothing) and a
# flip.
NATIVE = {"jpg": [{"op": "decode"},
                  {"op": "random_resized_crop", "size": 224,
                   "scale": [224 * 224 / (320 * 288)] * 2, "ratio": [1.0, 1.0]},
                  {"op": "horizontal_flip"}]}


class Trivial:
    def __len__(self):
        return 200_000

    def __getitem__(self, i):
        return np.full(8, i, dtype=np.float32)


class PurePython:
    def __len__(self):
        return 20_000

    def __getitem__(self, i):
        acc = 0
        for k in range(2_000):
            acc = (acc * 31 + k + i) % 1_000_003
        return acc


def make_images(root, n):
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:288, 0:320]
    for i in range(n):
        d = Path(root) / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        base = (xx * (1 + i % 7) + yy * (1 + i % 5)) % 256
        px = np.stack([base, (base + 85) % 256, (base * 3) % 256], -1).astype(np.uint8)
        px = np.clip(px.astype(np.int16) + rng.integers(-12, 12, px.shape), 0, 255).astype(np.uint8)
        Image.fromarray(px).save(d / f"{i:05d}.jpg", quality=90)


def run(make_loader, epochs):
    with Peak() as peak:
        start = time.perf_counter()
        loader = make_loader()
        first = None
        n = n0 = 0
        for _ in range(epochs):
            for batch in loader:
                x = batch[0] if isinstance(batch, (list, tuple)) else batch
                x = x["cls"] if isinstance(x, dict) else x
                n += len(x)
                if first is None:
                    first, n0 = time.perf_counter() - start, n
        elapsed = time.perf_counter() - start
        mode = getattr(loader, "worker_mode", None)  # chute's: what worker_mode="auto" chose
        del loader
    # per_s: everything from making the loader to its last batch; steady_per_s: after the
    # first batch (start-up excluded).
    return {"per_s": n / elapsed, "steady_per_s": (n - n0) / (elapsed - first),
            "first_s": first, "rss_mb": peak.rss / 2**20, "pss_mb": peak.pss / 2**20,
            "mode": mode}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1500)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="imagefolder,bytes,trivial,python")
    ap.add_argument("--scaling", default="", help="worker counts, e.g. 1,2")
    ap.add_argument("--fresh", action="store_true",
                    help="each run in a fresh interpreter (memory: nothing left from the "
                         "cases before)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # "set::case", for --fresh
    a = ap.parse_args()

    import torch.utils.data as tud

    import chute

    root = Path(tempfile.gettempdir()) / f"chute-imagefolder-{a.images}"
    if not root.exists():
        make_images(root, a.images)
    sets = {"imagefolder": (ImageFolder(root), 64), "bytes": (ImageFolder(root), 64),
            "trivial": (Trivial(), 256), "python": (PurePython(), 64)}
    for p in Path(root).glob("*/*.jpg"):  # warm the page cache
        p.read_bytes()
    results = {}
    for name in a.only.split(","):
        ds, bs = sets[name]
        w = a.workers
        cases = {
            "DataLoader(num_workers=0)": lambda: tud.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=0),
            f"DataLoader(num_workers={w})": lambda: tud.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=w),
            f"chute.Loader(num_workers={w})": lambda: chute.Loader(ds, batch_size=bs, shuffle=True, num_workers=w),
            f"chute.Loader(num_workers={w}, process)": lambda: chute.Loader(
                ds, batch_size=bs, shuffle=True, num_workers=w, worker_mode="process"),
            f"chute.Loader(num_workers={w}, auto)": lambda: chute.Loader(
                ds, batch_size=bs, shuffle=True, num_workers=w, worker_mode="auto"),
            "chute.Loader(num_workers=auto, auto)": lambda: chute.Loader(
                ds, batch_size=bs, shuffle=True, num_workers="auto", worker_mode="auto"),
        }
        if a.scaling:
            cases = {}
            for k in (int(x) for x in a.scaling.split(",")):
                cases[f"DataLoader(num_workers={k})"] = (
                    lambda k=k: tud.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=k))
                cases[f"chute.Loader(num_workers={k}, process)"] = (
                    lambda k=k: chute.Loader(ds, batch_size=bs, shuffle=True, num_workers=k,
                                             worker_mode="process"))
        if name == "bytes":
            # torch's loaders run the PIL dataset; chute the bytes one with native ops.
            raw = ImageBytes(root)
            cases[f"chute.Loader(num_workers={w})"] = lambda: chute.Loader(
                raw, batch_size=bs, shuffle=True, num_workers=w, transforms=NATIVE)
            for k in [c for c in cases if c.startswith("chute.Loader(") and c.endswith("auto)")
                      or c.endswith("process)")]:
                del cases[k]
        if a.one:
            if a.one.split("::")[0] == name:
                print(json.dumps(run(cases[a.one.split("::", 1)[1]], a.epochs)))
            continue
        # The cases take turns (each repeat runs every case once), so a slow spell of the
        # machine falls on all of them alike.
        runs = {case: [] for case in cases}
        for _ in range(a.repeats):
            for case, make in cases.items():
                if name in ("imagefolder", "bytes"):
                    for p in Path(root).glob("*/*.jpg"):  # the page cache warmed right before
                        p.read_bytes()
                if a.fresh:
                    args = [sys.executable, __file__, "--one", f"{name}::{case}"] + [
                        f"--{k}={v}" for k, v in (("images", a.images), ("epochs", a.epochs),
                                                  ("workers", a.workers), ("only", name),
                                                  ("scaling", a.scaling))]
                    out = subprocess.run(args, capture_output=True, text=True, check=True)
                    runs[case].append(json.loads(out.stdout.strip().splitlines()[-1]))
                else:
                    runs[case].append(run(make, a.epochs))
        for case in cases:
            med = {k: statistics.median(r[k] for r in runs[case]) for k in runs[case][0]
                   if k != "mode"}
            modes = [r["mode"] for r in runs[case] if r["mode"]]
            results[f"{name} {case}"] = med
            print(f"{name:12s} {case:37s} {med['per_s']:8.0f}/s  steady {med['steady_per_s']:8.0f}/s  "
                  f"first batch {med['first_s']:.3f} s  "
                  f"RSS {med['rss_mb']:7.0f} MB  PSS {med['pss_mb']:7.0f} MB"
                  + (f"  ({', '.join(modes)})" if "auto" in case else ""), flush=True)
    if not a.one:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
