"""Audio: chute against PyTorch's DataLoader with the usual Python audio stack, side by side in
one run. Data: `--n` clips of 1-20 s (seeded durations) of a speech-like signal (formant-
filtered voiced/unvoiced syllables, `python/tests/audio_media.py`) at `--rate` (44.1 or
48 kHz; Opus always 48 kHz), `--channels` channels, in one codec (`--codec flac|mp3|opus`:
FLAC 16-bit, MP3 from libmp3lame, Ogg Opus from libopus, FFmpeg's default bit rates) with a
`.cls` label, in WebDataset shards of `--per-shard` clips in a temp folder.

- the pipeline (default): decode, mono, resample to 16 kHz, Whisper's 80-bin log-mel
  (padded to 30 s), label, batches of 16, 2 workers:
  - chute: `chute.Loader(chute.webdataset(urls), batch_size=16, num_workers=2, transforms=
    {"flac;mp3;opus": {"as": "audio", "ops": [{"op": "decode_audio", "mono": True,
    "sample_rate": 16000}, {"op": "log_mel", "n_mels": 80}]}, "cls": [{"op": "label"}]})`;
  - peer: `torch.utils.data.DataLoader(num_workers=2, batch_size=16)` over a map-style
    Dataset that reads each member's bytes (offsets from one scan of the tars), decodes,
    downmixes, resamples and calls transformers' `WhisperFeatureExtractor(feature_size=80)`
    (`return_tensors="np"`; transformers computes it with torch's STFT when torch is
    installed). Every available decode path is measured and the fastest is the reference:
    torchcodec's `AudioDecoder(sample_rate=16000, num_channels=1)` (FFmpeg's own resampler);
    soundfile (libsndfile) + soxr HQ; PyAV (FFmpeg) + soxr HQ.
- `--raw`: decode only, at the file's rate and channels: chute `[{"op": "decode_audio"}]`
  (a batch is a list of float32 [C, N] arrays); the peers return the same arrays and collate
  a list.
- the limit: FFmpeg's decoder on one thread (PyAV, `thread_count=1`, in this process, no
  resampling): how many seconds of audio one core decodes per second.

    python benchsuite/audio_vs_dataloader.py [--codec flac|mp3|opus] [--n 256] [--repeat 3]
        [--raw] [--only peer|chute|limit]

Reports clips/s, seconds of audio per second and per second per core (the workers' count;
1 for the limit), the median of `--repeat` interleaved rounds, as a markdown table. Every
round builds a fresh loader (worker start-up counted). Needs numpy, torch, transformers,
soundfile, soxr, av; torchcodec optional (it needs FFmpeg's shared libraries installed).
"""

import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "tests"))
import audio_media  # noqa: E402

CODEC = {"flac": "flac16", "mp3": "mp3", "opus": "opus"}  # --codec -> audio_media codec
AUDIO_KEYS = "flac;mp3;opus"
TARGET_RATE = 16000


def make_shards(root, args):
    """The clips, written as WebDataset shards; returns (urls, durations in s, their rate)."""
    rng = np.random.default_rng(args.seed)
    rate = 48000 if args.codec == "opus" else args.rate
    durations = rng.uniform(1.0, 20.0, args.n)
    samples, urls = [], []
    for i, d in enumerate(durations):
        x = audio_media.speech_like(float(d), rate, seed=args.seed * 100003 + i,
                                    channels=args.channels)
        data = audio_media.encode(x, rate, CODEC[args.codec])
        samples.append({"__key__": f"{i:06d}", args.codec: data, "cls": i % 10})
        if len(samples) == args.per_shard or i == args.n - 1:
            urls.append(audio_media.write_wds_shard(root / f"shard-{len(urls):04d}.tar", samples))
            samples = []
    return urls, [round(float(d) * rate) / rate for d in durations], rate


def member_index(urls, ext):
    """(path, offset, size, label) of every clip, in shard order, from one scan of the tars."""
    out, labels = [], {}
    for url in urls:
        with tarfile.open(url) as tar:
            clips = []
            for m in tar.getmembers():
                key, _, e = m.name.partition(".")
                if e == ext:
                    clips.append((key, m.offset_data, m.size))
                elif e == "cls":
                    labels[key] = int(tar.extractfile(m).read())
        out.extend((url, off, size, labels[key]) for key, off, size in clips)
    return out


# ---------------------------------------------------------------- peer decode paths


def _mono(x):
    return x.mean(axis=0) if x.shape[0] > 1 else x[0]


def decode_torchcodec(data, raw):
    from torchcodec.decoders import AudioDecoder

    if raw:
        return AudioDecoder(data).get_all_samples().data.numpy()
    return AudioDecoder(data, sample_rate=TARGET_RATE, num_channels=1).get_all_samples().data.numpy()[0]


def decode_soundfile(data, raw):
    x, rate = audio_media.soundfile_decode(data)
    if raw:
        return x
    import soxr

    return soxr.resample(_mono(x), rate, TARGET_RATE, quality="HQ")


def decode_pyav(data, raw):
    x, rate = audio_media.ffmpeg_decode(data, threads=1)
    if raw:
        return x
    import soxr

    return soxr.resample(_mono(x), rate, TARGET_RATE, quality="HQ")


def peer_paths():
    """The decode paths that work here, by name."""
    paths = {}
    try:
        from torchcodec.decoders import AudioDecoder  # noqa: F401  (needs FFmpeg's .so files)

        paths["torchcodec"] = decode_torchcodec
    except Exception as e:  # ImportError, or RuntimeError when FFmpeg's libraries are missing
        print(f"torchcodec unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    for name, fn in (("soundfile+soxr", decode_soundfile), ("pyav+soxr", decode_pyav)):
        try:
            __import__("soxr"), __import__("soundfile" if name.startswith("soundfile") else "av")
            paths[name] = fn
        except ImportError as e:
            print(f"{name} unavailable: {e}")
    return paths


class Clips:
    """A map-style torch Dataset over the shards' audio members: bytes -> decode -> (features
    or the raw array, label). File handles are opened lazily, so each worker has its own;
    the feature extractor is built before the workers fork."""

    def __init__(self, index, decode, raw, n_mels):
        self.index, self.decode, self.raw = index, decode, raw
        self.files, self.fe = {}, None
        if not raw:  # built here, once: the forked workers inherit it (and transformers' import)
            import transformers

            self.fe = transformers.WhisperFeatureExtractor(feature_size=n_mels)

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        path, offset, size, label = self.index[i]
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = open(path, "rb")
        f.seek(offset)
        audio = self.decode(f.read(size), self.raw)
        if self.raw:  # a tensor: it reaches the main process through shared memory
            import torch

            return torch.from_numpy(np.ascontiguousarray(audio)), label
        feats = self.fe(audio, sampling_rate=TARGET_RATE, return_tensors="np")["input_features"][0]
        return feats, label


def collate_list(batch):
    return batch


def run_peer(index, decode, args):
    import torch

    ds = Clips(index, decode, args.raw, args.n_mels)
    kw = {"collate_fn": collate_list} if args.raw else {}
    n = 0
    for batch in torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=args.workers, **kw):
        n += len(batch) if args.raw else len(batch[1])
    return n


def chute_transforms(args):
    ops = [{"op": "decode_audio"}] if args.raw else [
        {"op": "decode_audio", "mono": True, "sample_rate": TARGET_RATE},
        {"op": "log_mel", "n_mels": args.n_mels}]
    return {AUDIO_KEYS: {"as": "audio", "ops": ops}, "cls": [{"op": "label"}]}


def run_chute(urls, args):
    import chute

    loader = chute.Loader(chute.webdataset(urls), batch_size=args.batch, num_workers=args.workers,
                          transforms=chute_transforms(args))
    return sum(len(b["cls"]) for b in loader)


def run_limit(index, args):
    """FFmpeg's decoder on one thread, every clip in turn, in this process: frames decoded,
    not converted to arrays."""
    import av

    handles = {}
    for path, offset, size, _ in index:
        f = handles.get(path) or handles.setdefault(path, open(path, "rb"))
        f.seek(offset)
        with av.open(io.BytesIO(f.read(size))) as container:
            stream = container.streams.audio[0]
            stream.codec_context.thread_count = 1
            for _ in container.decode(stream):
                pass
    for f in handles.values():
        f.close()
    return len(index)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", choices=sorted(CODEC), default="flac")
    ap.add_argument("--n", type=int, default=256, help="clips")
    ap.add_argument("--rate", type=int, choices=[44100, 48000], default=48000,
                    help="the clips' rate (Opus: 48000 always)")
    ap.add_argument("--channels", type=int, choices=[1, 2], default=1)
    ap.add_argument("--per-shard", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n-mels", type=int, default=80)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raw", action="store_true", help="decode only (no resampling, no features)")
    ap.add_argument("--only", choices=["peer", "chute", "limit"], action="append",
                    help="run only these (repeatable); default: all")
    args = ap.parse_args()
    only = set(args.only or ["peer", "chute", "limit"])
    with tempfile.TemporaryDirectory(prefix="chute-audio-") as tmp:
        run(Path(tmp), args, only)


def run(tmp, args, only):
    t = time.perf_counter()
    urls, durations, rate = make_shards(tmp, args)
    audio_s = sum(durations)
    size = sum(os.path.getsize(u) for u in urls)
    print(f"{args.n} {args.codec} clips at {rate} Hz x{args.channels}, {audio_s:,.0f} s of audio, "
          f"{size / 1e6:.1f} MB in {len(urls)} shards, written in {time.perf_counter() - t:.1f} s")
    index = member_index(urls, args.codec)
    assert len(index) == args.n

    cases = {}
    if "peer" in only:
        for name, fn in peer_paths().items():
            name = name.replace("+soxr", "") if args.raw else name
            cases[f"DataLoader({args.workers}) + {name}"] = (
                lambda fn=fn: run_peer(index, fn, args), args.workers)
    if "chute" in only:
        cases[f"chute.Loader({args.workers})"] = (lambda: run_chute(urls, args), args.workers)
    if "limit" in only:
        cases["limit: FFmpeg decode, 1 thread"] = (lambda: run_limit(index, args), 1)

    times = {k: [] for k in cases}
    for _ in range(args.repeat):
        for name, (fn, _) in cases.items():
            t = time.perf_counter()
            n = fn()
            times[name].append(time.perf_counter() - t)
            assert n == args.n, f"{name}: {n} clips of {args.n}"
    med = {k: statistics.median(v) for k, v in times.items()}

    import torch

    versions = [f"torch {torch.__version__}"]
    for mod in ("transformers", "soundfile", "soxr", "av", "torchcodec"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    what = "decode only (raw, native rate)" if args.raw else \
        f"decode + mono + 16 kHz + Whisper log-mel ({args.n_mels})"
    print(f"\n{what}, {args.codec}, batch {args.batch}, {os.cpu_count()} CPUs; "
          f"median of {args.repeat} rounds; {', '.join(versions)}\n")
    print("| case | clips/s | audio s/s | audio s/s/core | median s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    peers = [k for k in med if k.startswith("DataLoader")]
    best = min(peers, key=med.get) if peers else None
    for name, (_, cores) in cases.items():
        m = med[name]
        mark = " (fastest peer)" if name == best and len(peers) > 1 else ""
        print(f"| {name}{mark} | {args.n / m:,.1f} | {audio_s / m:,.0f} | {audio_s / m / cores:,.0f} "
              f"| {m:.2f} |")
    chute_name = f"chute.Loader({args.workers})"
    if best and chute_name in med:
        print(f"\nchute / fastest peer ({best}): {med[best] / med[chute_name]:.2f}x")
        if not args.raw:
            compare_first_batch(urls, index, peer_paths()[best.split(" + ", 1)[1]], args)


def compare_first_batch(urls, index, decode, args):
    """How far chute's features are from the peer's on the first batch (informational: the
    resamplers differ)."""
    import chute

    loader = chute.Loader(chute.webdataset(urls), batch_size=args.batch,
                          transforms=chute_transforms(args))
    got = np.asarray(next(iter(loader))["audio"])
    ds = Clips(index, decode, False, args.n_mels)
    want = np.stack([ds[i][0] for i in range(len(got))])
    if got.shape != want.shape:
        print(f"first batch: chute's features are {got.shape}, the peer's {want.shape}")
    else:
        d = np.abs(got.astype(np.float32) - want)
        print(f"first batch vs the peer's features: max abs diff {d.max():.3g}, mean {d.mean():.3g}")


if __name__ == "__main__":
    main()
