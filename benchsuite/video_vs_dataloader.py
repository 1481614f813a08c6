"""Video: chute against PyTorch's DataLoader with torchcodec (and PyAV), side by side in one run.
Data: `--n` H.264 videos (libx264 preset fast, CRF 23, yuv420p, B-frames as the preset has
them, a keyframe every `--gop` frames) of 5-10 s (seeded durations) at 30 fps, 854x480
(`--res 480`) or 1920x1080 (`--res 1080`), in MP4, with a `.cls` label, in WebDataset shards of
`--per-shard` videos in a temp folder (or `--cache DIR`, kept and reused). The content is a
textured picture (noise at three scales) panning under a moving window, so the bit rate is that
of real footage (about 2 Mbit/s at 480p, 10 at 1080p), not of a flat test pattern. Encoding
is slow on 2 cores, so only `--distinct` different videos are encoded; the `--n` samples
cycle through them (the same bytes under other keys: each is decoded anew all the same).

The pipeline: one clip of 16 frames (`--frames`) every `--stride` frames (span
stride*(frames-1)+1), its start drawn at random among those where it fits; resized so that the
shorter side is 256, then the center 224x224 (`--square`: resized to 224x224, no crop);
uint8 [16, 3, 224, 224]; batches of `--batch`, `--workers` workers:

- chute: `chute.Loader(chute.webdataset(urls), batch_size=8, num_workers=2, transforms=
  {"mp4": {"as": "video", "ops": [{"op": "decode_video", "frames": 16, "stride": 2,
  "sampler": "random", "resize": 256, "crop": 224, "layout": "TCHW"}]}, "cls": [{"op":
  "label"}]})`;
- peers: `torch.utils.data.DataLoader(num_workers=2, batch_size=8)` over a map-style Dataset that
  reads each member's bytes (offsets from one scan of the tars) and
  - torchcodec: `VideoDecoder(bytes, seek_mode="exact", dimension_order="NHWC")` and
    `torchcodec.samplers.clips_at_random_indices(num_frames_per_clip=16,
    num_indices_between_frames=2)`;
  - PyAV: a scan of the packets for the frames' pts (as exact mode does), a seek to the
    keyframe before the clip, decoding forward to its last frame (one thread), RGB frames
    of the ones in the clip;
  then `torch.nn.functional.interpolate(mode="bilinear", antialias=True)` on the uint8 frames
  (channels last: torch's fast path, as torchvision's Resize on tensors) and the center crop.
- the limit: FFmpeg's H.264 decoder on one thread (PyAV, `thread_count=1`, every frame of
  the distinct videos, no conversion to RGB): frames/s per core. A random clip decodes from
  the keyframe before its start to its last frame: the mean count of frames that needs (from
  the videos' keyframes) turns it into a bound in clips/s for `--workers` cores.

    python benchsuite/video_vs_dataloader.py [--res 480|1080] [--n 24] [--repeat 3]
        [--only chute|torchcodec|pyav|limit] [--cache DIR]

Reports clips/s, frames/s delivered (clips x frames) and per core (the workers' count; 1 for the
limit), the median of `--repeat` interleaved rounds (each round `--passes` epochs with a fresh
loader: worker start-up counted), as a markdown table, and chute / the fastest peer. Needs
numpy, torch, av; torchcodec optional (it needs the system's FFmpeg shared libraries).
"""

import argparse
import io
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "tests"))
import video_media  # noqa: E402

SIZES = {480: (854, 480), 1080: (1920, 1080)}
FPS = 30
SHORT_SIDE, CROP = 256, 224


# ---------------------------------------------------------------- data


def panning_video(width, height, seed):
    """frame_fn(i, w, h) for video_media.encode_video: a window of a textured canvas (noise at
    scales 64, 16 and 4 pixels) panning along a Lissajous path, 64 pixels each way."""
    rng = np.random.default_rng(seed)
    margin = 64
    h, w = height + 2 * margin, width + 2 * margin
    canvas = np.zeros((h, w, 3), np.float32)
    for scale, amplitude in ((64, 60), (16, 40), (4, 25)):
        small = rng.standard_normal((h // scale + 2, w // scale + 2, 3)).astype(np.float32)
        canvas += amplitude * np.repeat(np.repeat(small, scale, 0), scale, 1)[:h, :w]
    canvas = np.clip(128 + canvas, 0, 255).astype(np.uint8)
    phase = rng.uniform(0, 2 * np.pi)

    def frame(i, fw, fh):
        x = int(margin + margin * np.sin(i / 40 + phase))
        y = int(margin + margin * np.cos(i / 55 + phase))
        return canvas[y:y + fh, x:x + fw]

    return frame


def make_shards(root, args):
    """The videos as WebDataset shards (reused from root when its manifest matches): (urls,
    the distinct videos' bytes, which distinct video each sample is)."""
    width, height = SIZES[args.res]
    rng = np.random.default_rng(args.seed)
    durations = rng.uniform(5.0, 10.0, args.distinct)
    tag = f"{args.res}-{args.distinct}-{args.gop}-{args.seed}"
    distinct = []
    for d in range(args.distinct):
        path = root / f"distinct-{tag}-{d}.mp4"
        if not path.exists():
            frames = int(round(durations[d] * FPS))
            data = video_media.encode_video(
                "libx264", "mp4", width, height, FPS, frames, gop=args.gop, quality="fast",
                threads=0, preset="fast", frame_fn=panning_video(width, height, args.seed + d))
            path.write_bytes(data)
        distinct.append(path.read_bytes())
    which = [i % args.distinct for i in range(args.n)]
    urls, samples = [], []
    for i, d in enumerate(which):
        samples.append({"__key__": f"{i:06d}", "mp4": distinct[d], "cls": i % 10})
        if len(samples) == args.per_shard or i == args.n - 1:
            path = root / f"shard-{tag}-{args.n}-{len(urls):04d}.tar"
            urls.append(video_media.write_wds_shard(path, samples))
            samples = []
    return urls, distinct, which


def member_index(urls):
    """(path, offset, size, label) of every video, in shard order, from one scan of the tars."""
    out, labels = [], {}
    for url in urls:
        with tarfile.open(url) as tar:
            videos = []
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                if ext == "mp4":
                    videos.append((key, m.offset_data, m.size))
                elif ext == "cls":
                    labels[key] = int(tar.extractfile(m).read())
        out.extend((url, off, size, labels[key]) for key, off, size in videos)
    return out


# ---------------------------------------------------------------- peers


def resize_crop(frames, square):
    """uint8 [T, H, W, 3] (a torch tensor) -> uint8 [T, 3, 224, 224]: the shorter side to 256
    (torchvision's Resize(256)) then the center 224 (torchvision's CenterCrop), or 224x224
    with square; torch's antialiased bilinear on uint8, channels last."""
    import torch.nn.functional as F

    x = frames.permute(0, 3, 1, 2)  # a channels-last view
    h, w = x.shape[-2:]
    if square:
        return F.interpolate(x, size=(CROP, CROP), mode="bilinear", antialias=True).contiguous()
    if h <= w:
        size = (SHORT_SIDE, int(SHORT_SIDE * w / h))
    else:
        size = (int(SHORT_SIDE * h / w), SHORT_SIDE)
    y = F.interpolate(x, size=size, mode="bilinear", antialias=True)
    top, left = int(round((size[0] - CROP) / 2.0)), int(round((size[1] - CROP) / 2.0))
    return y[:, :, top:top + CROP, left:left + CROP].contiguous()


def clip_torchcodec(data, args):
    import torch
    from torchcodec.decoders import VideoDecoder
    from torchcodec.samplers import clips_at_random_indices

    dec = VideoDecoder(torch.frombuffer(bytearray(data), dtype=torch.uint8), seek_mode="exact",
                       dimension_order="NHWC", num_ffmpeg_threads=1)
    clip = clips_at_random_indices(dec, num_clips=1, num_frames_per_clip=args.frames,
                                   num_indices_between_frames=args.stride)
    return resize_crop(clip.data[0], args.square)


def clip_pyav(data, args):
    """A random clip by PyAV: the frames' pts from a scan of the packets, a seek to the keyframe
    at or before the clip's first frame, decoding forward to its last."""
    import av
    import torch

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "NONE"
        stream.codec_context.thread_count = 1
        pts = sorted(p.pts for p in container.demux(stream) if p.pts is not None)
        n = len(pts)
        span = args.stride * (args.frames - 1) + 1
        start = random.randrange(max(n - span + 1, 1))  # DataLoader seeds `random` per worker
        indices = list(range(start, min(start + span, n), args.stride))
        indices += [indices[-1]] * (args.frames - len(indices))
        wanted = {pts[i] for i in indices}
        container.seek(pts[start], stream=stream, backward=True, any_frame=False)
        got = {}
        for frame in container.decode(stream):
            if frame.pts in wanted:
                got[frame.pts] = frame.to_ndarray(format="rgb24", threads=1)
            if frame.pts >= pts[indices[-1]]:
                break
    frames = torch.from_numpy(np.stack([got[pts[i]] for i in indices]))
    return resize_crop(frames, args.square)


PEERS = {"torchcodec": clip_torchcodec, "pyav": clip_pyav}


class Clips:
    """A map-style torch Dataset over the shards' videos: bytes -> a random clip -> resized and
    cropped uint8 [T, 3, 224, 224], label. File handles are opened lazily (one per worker)."""

    def __init__(self, index, clip, args):
        self.index, self.clip, self.args, self.files = index, clip, args, {}

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        path, offset, size, label = self.index[i]
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = open(path, "rb")
        f.seek(offset)
        return self.clip(f.read(size), self.args), label


def run_peer(index, clip, args):
    import torch

    loader = torch.utils.data.DataLoader(Clips(index, clip, args), batch_size=args.batch,
                                         num_workers=args.workers, shuffle=True,
                                         persistent_workers=args.workers > 0)
    n = 0
    for _ in range(args.passes):
        for videos, labels in loader:
            assert videos.shape[1:] == (args.frames, 3, CROP, CROP), videos.shape
            n += len(labels)
    return n


def chute_transforms(args):
    op = {"op": "decode_video", "frames": args.frames, "stride": args.stride,
          "sampler": "random", "layout": "TCHW"}
    op.update({"resize": [CROP, CROP]} if args.square else {"resize": SHORT_SIDE, "crop": CROP})
    return {"mp4": {"as": "video", "ops": [op]}, "cls": [{"op": "label"}]}


def run_chute(urls, args):
    import chute

    loader = chute.Loader(chute.webdataset(urls), batch_size=args.batch, shuffle=True,
                          num_workers=args.workers, seed=args.seed,
                          transforms=chute_transforms(args))
    n = 0
    for epoch in range(args.passes):
        loader.set_epoch(epoch)
        for b in loader:
            assert tuple(b["video"].shape[1:]) == (args.frames, 3, CROP, CROP), b["video"].shape
            n += len(b["cls"])
    return n


def run_limit(distinct):
    """FFmpeg's decoder on one thread, every frame of each distinct video, in this process:
    the frames decoded (not converted)."""
    return sum(video_media.pyav_decode_count(d, threads=1) for d in distinct)


def frames_per_clip(data, args):
    """The mean number of frames decoded for a random clip of data: from the keyframe at or
    before the start through the clip's last frame, averaged over every start."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        packets = sorted((p.pts, p.is_keyframe) for p in container.demux(stream)
                         if p.pts is not None)
    keys = [i for i, (_, k) in enumerate(packets) if k]
    n = len(packets)
    span = args.stride * (args.frames - 1) + 1
    starts = range(max(n - span + 1, 1))
    cost = [s - max(k for k in keys if k <= s) + min(span, n - s) for s in starts]
    return float(np.mean(cost)), n, len(keys)


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--res", type=int, choices=sorted(SIZES), default=480)
    ap.add_argument("--n", type=int, default=24, help="videos (samples)")
    ap.add_argument("--distinct", type=int, default=None,
                    help="distinct videos encoded (default: 4 at 480p, 2 at 1080p)")
    ap.add_argument("--gop", type=int, default=30, help="frames between keyframes")
    ap.add_argument("--frames", type=int, default=16, help="frames per clip")
    ap.add_argument("--stride", type=int, default=2, help="frame-index step in a clip")
    ap.add_argument("--square", action="store_true", help="resize to 224x224 (no crop)")
    ap.add_argument("--per-shard", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--passes", type=int, default=None,
                    help="epochs per round (default: 3 at 480p, 1 at 1080p)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, help="keep the videos here (reused by later runs)")
    ap.add_argument("--only", choices=["chute", "torchcodec", "pyav", "limit"], action="append",
                    help="run only these (repeatable); default: all")
    args = ap.parse_args()
    if args.distinct is None:
        args.distinct = 4 if args.res == 480 else 2
    if args.passes is None:
        args.passes = 3 if args.res == 480 else 1
    only = set(args.only or ["chute", "torchcodec", "pyav", "limit"])
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
        run(args.cache, args, only)
    else:
        with tempfile.TemporaryDirectory(prefix="chute-video-") as tmp:
            run(Path(tmp), args, only)


def run(root, args, only):
    t = time.perf_counter()
    urls, distinct, which = make_shards(root, args)
    width, height = SIZES[args.res]
    stats = [frames_per_clip(d, args) for d in distinct]
    seconds = sum(s[1] for s in stats) / FPS
    size = sum(len(d) for d in distinct)
    print(f"{args.distinct} distinct H.264 videos {width}x{height} {FPS} fps, GOP {args.gop}, "
          f"{seconds:.1f} s, {size * 8 / seconds / 1e6:.1f} Mbit/s; {args.n} samples in "
          f"{len(urls)} shards; ready in {time.perf_counter() - t:.1f} s")
    index = member_index(urls)
    assert len(index) == args.n
    per_clip = float(np.mean([stats[d][0] for d in which]))
    print(f"a clip: {args.frames} frames, stride {args.stride} (span "
          f"{args.stride * (args.frames - 1) + 1}): {per_clip:.1f} frames decoded on average "
          f"(from the keyframe before it)")

    cases = {}
    if "chute" in only:
        cases[f"chute.Loader({args.workers})"] = (lambda: run_chute(urls, args), args.workers)
    for name, clip in PEERS.items():
        if name not in only:
            continue
        try:
            if name == "torchcodec":
                from torchcodec.decoders import VideoDecoder  # noqa: F401  (FFmpeg's .so files)
            else:
                import av  # noqa: F401
        except Exception as e:
            print(f"{name} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        cases[f"DataLoader({args.workers}) + {name}"] = (
            lambda clip=clip: run_peer(index, clip, args), args.workers)
    clips_per_round = args.n * args.passes
    decoded_frames = sum(s[1] for s in stats)
    if "limit" in only:
        cases["limit: FFmpeg decode, 1 thread"] = (lambda: run_limit(distinct), 1)

    times = {k: [] for k in cases}
    for _ in range(args.repeat):
        for name, (fn, _) in cases.items():
            t = time.perf_counter()
            n = fn()
            times[name].append(time.perf_counter() - t)
            want = decoded_frames if name.startswith("limit") else clips_per_round
            assert n == want, f"{name}: {n} of {want}"
    med = {k: statistics.median(v) for k, v in times.items()}

    import torch

    versions = [f"torch {torch.__version__}"]
    for mod in ("av", "torchcodec"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    resize = "224x224" if args.square else f"shorter side {SHORT_SIDE}, center {CROP}"
    print(f"\n{args.res}p, random clips of {args.frames} frames stride {args.stride}, {resize}, "
          f"batch {args.batch}, {os.cpu_count()} CPUs; median of {args.repeat} rounds of "
          f"{clips_per_round} clips; {', '.join(versions)}\n")
    print("| case | clips/s | frames/s | frames/s/core | median s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    peers = [k for k in med if k.startswith("DataLoader")]
    best = min(peers, key=med.get) if peers else None
    for name, (_, cores) in cases.items():
        m = med[name]
        if name.startswith("limit"):
            fps = decoded_frames / m
            bound = fps * args.workers / per_clip
            print(f"| {name} (decoded frames; bound on {args.workers} cores: {bound:,.1f} clips/s) "
                  f"| {fps / per_clip:,.1f} | {fps:,.0f} | {fps:,.0f} | {m:.2f} |")
            continue
        mark = " (fastest peer)" if name == best and len(peers) > 1 else ""
        rate = clips_per_round / m
        print(f"| {name}{mark} | {rate:,.2f} | {rate * args.frames:,.0f} | "
              f"{rate * args.frames / cores:,.0f} | {m:.2f} |")
    chute_name = f"chute.Loader({args.workers})"
    if best and chute_name in med:
        print(f"\nchute / fastest peer ({best}): {med[best] / med[chute_name]:.2f}x")
    if "limit" in med and chute_name in med:
        bound = decoded_frames / med["limit: FFmpeg decode, 1 thread"] * args.workers / per_clip
        print(f"chute / the decode bound on {args.workers} cores: "
              f"{clips_per_round / med[chute_name] / bound:.2f}")


if __name__ == "__main__":
    main()
