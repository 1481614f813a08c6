"""Video the video tests and benchmarks use: deterministic frames that differ from one frame to
the next and carry their own number, encoded in memory with PyAV to every codec/container
pair chute reads, the reference decoder chute is compared with (torchcodec, on the system's
FFmpeg), and WebDataset shards.

- `pattern(i, width, height)` -> uint8 [H, W, 3] RGB: smooth gradients that move with i, and
  a band at the top holding i in binary (8 cells, white = 1, most significant bit left), so
  a decoded frame says which frame it is (`frame_number`) through lossy coding.
- `encode(case)` / `encode_video(...)` -> the bytes of a file. `CASES` names the pairs tested
  (codec, container, size, fps, GOP, B-frames); `available(case)` says whether this PyAV
  has the encoder (`encoders()` lists them), `missing_reason(case)` why not; `summary()`
  (or running this file) prints each case as torchcodec sees it. AV1 is SVT-AV1's (PyAV's
  wheel has no libaom).
- `torchcodec_frames(data, indices)` -> (uint8 [T, H, W, 3], float64 pts [T]): torchcodec's
  `VideoDecoder(data, seek_mode="exact").get_frames_at(indices)`, channels last.
- `pyav_frames(data)`: every frame in presentation order through PyAV (its bundled FFmpeg),
  as (rgb [H, W, 3], pts seconds) pairs; `pyav_decode_count(data, threads)` only decodes.
- `write_wds_shard(path, samples)`: a WebDataset tar of members `KEY.EXT` (audio_media's).

The same arguments give the same bytes (one encoder thread, FFmpeg's bitexact flag).

What the references do with these files (torchcodec 0.17 on Debian's FFmpeg 5.1, PyAV 16 with
its own FFmpeg 8): every frame of every case bit-identical between the two, and the exact-mode
frame count the encoded count for every container (MKV and TS included). Timestamps: MKV/WebM
keep milliseconds (60 fps pts 0, 0.017, 0.033, ...; the end 0.599 s, not 0.6); MPEG-TS starts
at 2/30 s, not 0 (the B-frame delay); H.264 in AVI starts at 0 for FFmpeg 5.1 and at one frame
for FFmpeg 8 (AVI has no pts). torchcodec seeks wrongly in MPEG-TS (index 0 gives frame 12, the
last two GOPs fail) and in AVI with B-frames (fails): the AVI cases have no B-frames, and the
tests' reference for TS is `pyav_frames`.
Needs numpy and av (PyAV, whose wheel bundles FFmpeg with libx264, libx265, libvpx,
SVT-AV1); torchcodec for the reference (it needs the system's FFmpeg shared libraries:
libavcodec, libavformat, libavutil, libswscale, libavfilter, libavdevice).
"""

import io
import os
from fractions import Fraction
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from audio_media import write_wds_shard  # noqa: F401  (re-exported: the same tar layout)

BITS = 8  # frame numbers in the code band: 0..255
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1: errors only (it prints its settings otherwise)


# ---------------------------------------------------------------- frames


def pattern(i: int, width: int, height: int) -> np.ndarray:
    """Frame i: uint8 [height, width, 3] RGB. Below the code band, three sinusoidal gradients
    (one per channel) whose phases move with i, so consecutive frames differ everywhere
    (by a few levels per pixel at least) while staying smooth enough for any codec to keep;
    in the band (the top eighth, 8 rows at least), i mod 256 in binary, 8 cells across."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / width, y / height
    r = 128 + 90 * np.sin(2 * np.pi * (1.5 * u + i / 20.0))
    g = 128 + 90 * np.sin(2 * np.pi * (v + 0.5 * u - i / 15.0))
    b = 128 + 90 * np.cos(2 * np.pi * (u + v + i / 25.0))
    img = np.stack([r, g, b], axis=-1)
    band = _band(height)
    cell = width // BITS
    for bit in range(BITS):
        on = (i >> (BITS - 1 - bit)) & 1
        img[:band, bit * cell:(bit + 1) * cell] = 235 if on else 20
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def _band(height: int) -> int:
    return max(8, height // 8)


def frame_number(rgb: np.ndarray) -> int:
    """The frame number `pattern` wrote into a decoded frame (uint8 [H, W, 3], or [3, H, W]
    with channels first): each cell's interior (2 pixels in from its edges) read as 1 when
    its mean is over 128. Frames at their native size only."""
    rgb = np.asarray(rgb)
    if rgb.shape[0] == 3 and rgb.shape[-1] != 3:
        rgb = np.moveaxis(rgb, 0, -1)
    height, width = rgb.shape[:2]
    band, cell = _band(height), width // BITS
    n = 0
    for bit in range(BITS):
        inner = rgb[2:band - 2, bit * cell + 2:(bit + 1) * cell - 2]
        n = (n << 1) | int(inner.mean() > 128)
    return n


# ---------------------------------------------------------------- encoders


class Case(NamedTuple):
    """One test video: encoder (PyAV's name), container (FFmpeg's muxer) and the file
    extension, size, frame rate, frame count, GOP (keyframe interval) and B-frames (None:
    the encoder's default; x264's preset gives 3)."""

    name: str
    encoder: str
    container: str
    ext: str
    width: int
    height: int
    fps: Fraction
    frames: int
    gop: int = 12
    bframes: Optional[int] = None


def _case(name, encoder, container, ext, size, fps, frames, gop=12, bframes=None):
    return Case(name, encoder, container, ext, size[0], size[1], Fraction(fps), frames, gop,
                bframes)


NTSC = Fraction(30000, 1001)
# Every (codec, container) pair the tests decode. Sizes and rates vary so a wrong stride,
# plane offset or time base shows; frames 30-60; GOPs of 12 (24 for one) so that a frame in
# the middle needs a seek to the keyframe before it and decoding forward through B-frames.
CASES: Dict[str, Case] = {c.name: c for c in [
    _case("h264-mp4", "libx264", "mp4", "mp4", (160, 90), NTSC, 48),
    _case("h264-mkv", "libx264", "matroska", "mkv", (96, 64), 25, 40),
    _case("h264-mkv-60fps", "libx264", "matroska", "mkv", (320, 240), 60, 36, gop=24),
    _case("h264-ts", "libx264", "mpegts", "ts", (96, 64), 30, 36),
    _case("h264-avi", "libx264", "avi", "avi", (96, 64), 24, 30, bframes=0),
    _case("hevc-mp4", "libx265", "mp4", "mp4", (96, 64), 24, 36),
    _case("hevc-mkv", "libx265", "matroska", "mkv", (160, 90), NTSC, 30),
    _case("vp9-webm", "libvpx-vp9", "webm", "webm", (160, 90), 25, 40),
    _case("vp9-mkv", "libvpx-vp9", "matroska", "mkv", (96, 64), 30, 30),
    _case("av1-webm", "libsvtav1", "webm", "webm", (96, 64), 24, 30, gop=12),
    _case("av1-mp4", "libsvtav1", "mp4", "mp4", (160, 96), 30, 30, gop=12),
    _case("mpeg4-avi", "mpeg4", "avi", "avi", (96, 64), 25, 36, bframes=0),
    _case("mpeg4-mp4", "mpeg4", "mp4", "mp4", (160, 90), 30, 36, bframes=2),
]}


def _has_encoder(name: str) -> bool:
    try:
        import av

        av.codec.Codec(name, "w")
        return True
    except Exception:  # ImportError (no PyAV), av.codec.codec.UnknownCodecError
        return False


def encoders() -> Dict[str, bool]:
    """The encoders CASES use: whether this PyAV has each."""
    return {e: _has_encoder(e) for e in sorted({c.encoder for c in CASES.values()})}


def available(case: Union[str, Case]) -> bool:
    case = CASES[case] if isinstance(case, str) else case
    return _has_encoder(case.encoder)


def missing_reason(case: Union[str, Case]) -> str:
    case = CASES[case] if isinstance(case, str) else case
    return f"PyAV here has no {case.encoder} encoder (for {case.name})"


def encode(case: Union[str, Case], frames: Optional[int] = None) -> bytes:
    """The bytes of case's video (frames: another frame count)."""
    case = CASES[case] if isinstance(case, str) else case
    return encode_video(case.encoder, case.container, case.width, case.height, case.fps,
                        case.frames if frames is None else frames, gop=case.gop,
                        bframes=case.bframes)


def encode_video(encoder: str, container: str, width: int, height: int,
                 fps: Union[int, Fraction], frames: int, gop: int = 12,
                 bframes: Optional[int] = None, quality: str = "high", first: int = 0,
                 threads: int = 1, preset: Optional[str] = None,
                 frame_fn=None) -> bytes:
    """frames frames of `pattern` (numbered from first), encoded by encoder (PyAV's name:
    libx264, libx265, libvpx-vp9, libsvtav1, mpeg4...) at fps, yuv420p, a keyframe every gop
    frames (x264/x265: no scene-cut keyframes), bframes B-frames (None: the encoder's
    default), in container (mp4, matroska, webm, mpegts, avi). quality "high" keeps the
    code band readable (x264/x265 CRF 18, VP9/AV1 CRF 20, MPEG-4 qscale 3); "fast" is for
    benchmarks (x264 CRF 23, the encoder's defaults otherwise). threads: the encoder's.
    The bytes are not the same on every call, even on one thread (libx264 as PyAV bundles it
    encodes the first GOP differently now and then): a test encodes a video once and decodes
    that copy for its references. frame_fn(i, width, height) -> uint8 [H, W, 3] replaces
    `pattern`."""
    import av

    if width % 2 or height % 2:
        raise ValueError(f"{width}x{height}: yuv420p needs even sizes")
    fps = Fraction(fps)
    frame_fn = frame_fn or pattern
    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(encoder, rate=fps)
        cc = stream.codec_context
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        cc.time_base = 1 / fps
        cc.gop_size = gop
        cc.thread_count = threads
        opts = {}
        if encoder == "libx264":
            opts["preset"] = preset or "veryfast"
            opts["crf"] = "18" if quality == "high" else "23"
            params = [f"keyint={gop}", f"min-keyint={gop}", "scenecut=0"]
            if bframes is not None:
                params.append(f"bframes={bframes}")
            opts["x264-params"] = ":".join(params)
        elif encoder == "libx265":
            opts["preset"] = preset or "veryfast"
            opts["crf"] = "18" if quality == "high" else "26"
            params = [f"keyint={gop}", f"min-keyint={gop}", "scenecut=0", "log-level=error",
                      f"pools={threads}", "frame-threads=1"]
            if bframes is not None:
                params.append(f"bframes={bframes}")
            opts["x265-params"] = ":".join(params)
        elif encoder == "libvpx-vp9":
            opts.update({"crf": "20" if quality == "high" else "32", "b": "0",
                         "deadline": "realtime" if quality != "high" else "good",
                         "cpu-used": "8" if quality != "high" else "4",
                         "row-mt": "0", "lag-in-frames": "16" if bframes != 0 else "0"})
        elif encoder == "libsvtav1":
            opts.update({"crf": "20" if quality == "high" else "35",
                         "preset": preset or "10"})
            opts["svtav1-params"] = f"keyint={gop}:lp={threads}"
        elif encoder in ("mpeg4", "mpeg2video"):
            cc.qmin = cc.qmax = 3 if quality == "high" else 5
            if bframes is not None:
                cc.max_b_frames = bframes
        stream.options = opts
        for i in range(frames):
            img = frame_fn(first + i, width, height)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = i, 1 / fps
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


# ---------------------------------------------------------------- reference decoders


def torchcodec_decoder(data: Union[bytes, str]):
    """torchcodec's VideoDecoder of data (bytes or a path) in exact seek mode (every packet
    scanned: exact frame count, pts and keyframes), frames as [C, H, W]."""
    import torch
    from torchcodec.decoders import VideoDecoder

    if isinstance(data, (bytes, bytearray)):
        data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return VideoDecoder(data, seek_mode="exact")


def torchcodec_frames(data: Union[bytes, str], indices: Sequence[int]
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """torchcodec's frames at indices (exact mode): uint8 [T, H, W, 3] and pts in seconds,
    float64 [T]."""
    batch = torchcodec_decoder(data).get_frames_at(indices=[int(i) for i in indices])
    return (np.ascontiguousarray(batch.data.permute(0, 2, 3, 1).numpy()),
            batch.pts_seconds.numpy().astype(np.float64))


def torchcodec_all(data: Union[bytes, str]) -> Tuple[np.ndarray, np.ndarray]:
    """Every frame (exact mode): uint8 [N, H, W, 3] and pts float64 [N]."""
    n = torchcodec_decoder(data).metadata.num_frames
    return torchcodec_frames(data, range(n))


def pyav_frames(data: bytes) -> List[Tuple[np.ndarray, float]]:
    """Every frame of the first video stream in presentation order, decoded by PyAV (its own
    FFmpeg, not the system's): (uint8 [H, W, 3] RGB, pts in seconds) pairs."""
    import av

    out = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            out.append((frame.to_ndarray(format="rgb24"), float(frame.pts * frame.time_base)))
    out.sort(key=lambda f: f[1])
    return out


def pyav_decode_count(data: bytes, threads: int = 1) -> int:
    """Decodes every frame of data's first video stream with FFmpeg's decoder on `threads`
    threads (PyAV), converting none to RGB: the frame count."""
    import av

    n = 0
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = threads
        stream.thread_type = "NONE" if threads == 1 else "AUTO"
        for _ in container.decode(stream):
            n += 1
    return n


def summary() -> str:
    """A line per case: encoder present, bytes, and what torchcodec says of it (frames,
    begin/end seconds, average fps); for reports."""
    lines = []
    for case in CASES.values():
        if not available(case):
            lines.append(f"{case.name}: {missing_reason(case)}")
            continue
        data = encode(case)
        try:
            md = torchcodec_decoder(data).metadata
            tc = (f"torchcodec: {md.num_frames} frames, {md.begin_stream_seconds:.4f}-"
                  f"{md.end_stream_seconds:.4f} s, {md.average_fps:.3f} fps, {md.codec}")
        except Exception as e:  # torchcodec or FFmpeg's libraries missing
            tc = f"torchcodec: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        lines.append(f"{case.name}: {case.width}x{case.height} {float(case.fps):.3f} fps "
                     f"{case.frames} frames, {len(data)} bytes; {tc}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(encoders())
    print(summary())
