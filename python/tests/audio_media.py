"""Audio the audio tests and benchmarks use: deterministic signals, encoded in memory to every
container/codec chute reads, the reference decoders chute is compared with, and WebDataset
shards.

Signals are float32 [C, N] in [-0.9, 0.9] (C channels, N samples), as the decoders return.

- `sine`, `chirp`, `speech_like`: generators (a seed gives the same samples everywhere).
- `encode(x, rate, codec)` -> bytes, codec one of `CODECS` (the file extension in `EXTENSION`):
  wav16/wav24/wav32/wavf and flac16/flac24 (soundfile, lossless), vorbis (soundfile, Ogg),
  mp3 (PyAV's libmp3lame), opus (Ogg) and opus_webm (PyAV's libopus: 8/12/16/24/48 kHz only),
  aac and alac (M4A, PyAV). Lossy codecs change the samples; see `ffmpeg_decode` for the
  lengths that come back. The same input gives the same bytes (Ogg serial numbers fixed,
  FFmpeg's bitexact flag).
- `soundfile_decode(data)`, `ffmpeg_decode(data)` -> (float32 [C, N], rate), no resampling.
- `write_wds_shard(path, samples)`: a WebDataset tar of members `KEY.EXT`.

Needs numpy, soundfile and av (PyAV, whose wheel bundles FFmpeg with libopus and libmp3lame).
"""

import io
import tarfile
from fractions import Fraction
from typing import Dict, Iterable, Sequence, Tuple, Union

import numpy as np

RATES = (8000, 16000, 22050, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # libopus's; it decodes at 48 kHz always

# ---------------------------------------------------------------- signals


def sine(duration: float, rate: int, freqs: Sequence[float] = (440.0,), amplitude: float = 0.5,
         channels: int = 1) -> np.ndarray:
    """A tone per channel: channel c plays freqs[c % len(freqs)] Hz."""
    t = np.arange(int(round(duration * rate))) / rate
    x = [amplitude * np.sin(2 * np.pi * freqs[c % len(freqs)] * t) for c in range(channels)]
    return np.asarray(x, np.float32)


def chirp(duration: float, rate: int, f0: float = 50.0, f1: float = None, amplitude: float = 0.8,
          channels: int = 1) -> np.ndarray:
    """A linear sweep from f0 to f1 Hz (default: 0.45 x the rate, just under Nyquist); a second
    channel sweeps down."""
    f1 = 0.45 * rate if f1 is None else f1
    t = np.arange(int(round(duration * rate))) / rate
    up = np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * duration) * t * t))
    down = np.sin(2 * np.pi * (f1 * t - (f1 - f0) / (2 * duration) * t * t))
    return (amplitude * np.stack([up, down][:1] + [down] * (channels - 1))).astype(np.float32)


def speech_like(duration: float, rate: int, seed: int = 0, channels: int = 1) -> np.ndarray:
    """Syllables of 120-350 ms with pauses: a voiced source (a sawtooth at 90-230 Hz with vibrato)
    or an unvoiced one (white noise), shaped by three formant band-passes (Gaussian bumps in
    frequency, F1 250-900 Hz, F2 800-2500, F3 2000-3500, capped under Nyquist) and a Hann
    envelope of random loudness; peak 0.9. Channel c > 0: channel 0 delayed c ms at 0.7x
    gain, plus its own quiet noise (so a downmix is not a copy of one channel)."""
    rng = np.random.default_rng(seed)
    n = int(round(duration * rate))
    out = np.zeros(n)
    pos = 0
    while pos < n:
        seg = min(int(rng.uniform(0.12, 0.35) * rate), n - pos)
        t = np.arange(seg) / rate
        if rng.random() < 0.75:
            f0 = rng.uniform(90, 230) * (1 + 0.05 * np.sin(2 * np.pi * rng.uniform(2, 6) * t))
            phase = np.cumsum(f0) / rate
            src = 2 * (phase % 1.0) - 1 + 0.05 * rng.standard_normal(seg)
        else:
            src = rng.standard_normal(seg)
        freqs = np.fft.rfftfreq(seg, 1 / rate)
        gain = np.zeros_like(freqs)
        for lo, hi, bw, a in ((250, 900, 80, 1.0), (800, 2500, 120, 0.6), (2000, 3500, 200, 0.3)):
            f = min(rng.uniform(lo, hi), 0.45 * rate)
            gain += a * np.exp(-0.5 * ((freqs - f) / bw) ** 2)
        y = np.fft.irfft(np.fft.rfft(src) * gain, seg)
        y *= np.hanning(seg) * rng.uniform(0.2, 1.0) / (np.abs(y).max() + 1e-9)
        out[pos:pos + seg] = y
        pos += seg + int(rng.choice([0.01, 0.05, rng.uniform(0.1, 0.4)], p=[0.6, 0.3, 0.1]) * rate)
    out *= 0.9 / (np.abs(out).max() + 1e-9)
    chans = [out]
    for c in range(1, channels):
        d = int(rate * c / 1000)
        chans.append(0.7 * np.concatenate([np.zeros(d), out[:n - d]]) + 0.01 * rng.standard_normal(n))
    return np.clip(np.stack(chans), -0.9, 0.9).astype(np.float32)


# ---------------------------------------------------------------- encoders

_SOUNDFILE = {  # codec: (format, subtype)
    "wav16": ("WAV", "PCM_16"), "wav24": ("WAV", "PCM_24"), "wav32": ("WAV", "PCM_32"),
    "wavf": ("WAV", "FLOAT"), "flac16": ("FLAC", "PCM_16"), "flac24": ("FLAC", "PCM_24"),
    "vorbis": ("OGG", "VORBIS"),
}
_PYAV = {  # codec: (container format, encoder, sample format)
    "mp3": ("mp3", "libmp3lame", "fltp"), "opus": ("ogg", "libopus", "flt"),
    "opus_webm": ("webm", "libopus", "flt"), "aac": ("ipod", "aac", "fltp"),
    "alac": ("ipod", "alac", "s16p"),
}
CODECS = tuple(_SOUNDFILE) + tuple(_PYAV)
EXTENSION = {"wav16": "wav", "wav24": "wav", "wav32": "wav", "wavf": "wav", "flac16": "flac",
             "flac24": "flac", "vorbis": "ogg", "mp3": "mp3", "opus": "opus",
             "opus_webm": "webm", "aac": "m4a", "alac": "m4a"}


def encode(x: np.ndarray, rate: int, codec: str, bit_rate: int = None) -> bytes:
    """x (float32 [C, N] or [N]) encoded as codec (one of CODECS) into the bytes of a file.
    bit_rate: bits/s for the PyAV lossy encoders (FFmpeg's default when None)."""
    x = np.atleast_2d(np.asarray(x, np.float32))
    if codec in _SOUNDFILE:
        import soundfile as sf

        fmt, subtype = _SOUNDFILE[codec]
        buf = io.BytesIO()
        sf.write(buf, x.T, rate, format=fmt, subtype=subtype)
        # libsndfile gives each Ogg stream a random serial number: fixed, for the same bytes
        return _ogg_serial(buf.getvalue()) if fmt == "OGG" else buf.getvalue()
    if codec not in _PYAV:
        raise ValueError(f"unknown codec {codec!r}: one of {CODECS}")
    fmt, encoder, sample_fmt = _PYAV[codec]
    if encoder == "libopus" and rate not in OPUS_RATES:
        raise ValueError(f"libopus encodes only at {OPUS_RATES} Hz, not {rate}")
    return _pyav_encode(x, rate, fmt, encoder, sample_fmt, bit_rate)


def _pyav_encode(x, rate, fmt, encoder, sample_fmt, bit_rate):
    import av

    channels = x.shape[0]
    layout = {1: "mono", 2: "stereo"}[channels]
    if sample_fmt.startswith("s16"):
        x = np.clip(np.round(x * 32768), -32768, 32767).astype(np.int16)
    buf = io.BytesIO()
    # bitexact: no random Ogg serial numbers or Matroska UIDs, so the same input gives the same bytes
    with av.open(buf, "w", format=fmt, options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(encoder, rate=rate, layout=layout, format=sample_fmt)
        if bit_rate:
            stream.codec_context.bit_rate = bit_rate
        stream.codec_context.open()  # sets frame_size (0: the encoder takes any size)
        step = stream.codec_context.frame_size or 4096
        for start in range(0, x.shape[1], step):
            chunk = x[:, start:start + step]
            if not sample_fmt.endswith("p"):  # packed: one row of interleaved samples
                chunk = chunk.T.reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format=sample_fmt,
                                               layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def _ogg_crc_table():
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7 if r & 0x80000000 else r << 1) & 0xFFFFFFFF
        table.append(r)
    return table


_OGG_CRC = _ogg_crc_table()


def _ogg_serial(data: bytes, serial: int = 1) -> bytes:
    """An Ogg file (one logical stream) with every page's serial number set to serial and its
    CRC (polynomial 0x04C11DB7, no reflection) recomputed."""
    out, pos = bytearray(data), 0
    while pos < len(out):
        assert out[pos:pos + 4] == b"OggS", "not an Ogg page"
        nseg = out[pos + 26]
        end = pos + 27 + nseg + sum(out[pos + 27:pos + 27 + nseg])
        out[pos + 14:pos + 18] = serial.to_bytes(4, "little")
        out[pos + 22:pos + 26] = bytes(4)
        crc = 0
        for b in out[pos:end]:
            crc = ((crc << 8) & 0xFFFFFFFF) ^ _OGG_CRC[(crc >> 24) ^ b]
        out[pos + 22:pos + 26] = crc.to_bytes(4, "little")
        pos = end
    return bytes(out)


# ---------------------------------------------------------------- reference decoders


def soundfile_decode(data: bytes) -> Tuple[np.ndarray, int]:
    """libsndfile's decode (WAV, FLAC, Ogg Vorbis/Opus, MP3): float32 [C, N] and the rate."""
    import soundfile as sf

    y, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return np.ascontiguousarray(y.T), rate


_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0, "s64": 9223372036854775808.0}


def ffmpeg_decode(data: bytes, threads: int = 0) -> Tuple[np.ndarray, int]:
    """FFmpeg's decode (through PyAV) of the first audio stream, every frame, at the stream's
    own rate and channel count: float32 [C, N] and the rate. Integer samples are scaled by
    1/2^(bits-1) (u8 centred at 128). FFmpeg drops the encoder's priming samples where the
    file says how many (Opus pre-skip, MP3's LAME header, M4A's edit list): no offset for
    any codec here. The end is trimmed for MP3 and Opus (Ogg granule, WebM DiscardPadding)
    but not for AAC in M4A, which comes out rounded up to whole 1024-sample frames. Opus
    always decodes at 48 kHz (libsndfile: at the rate the header records). threads: the
    decoder's thread_count (0: FFmpeg's choice)."""
    import av

    chunks, rate = [], None
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        stream.codec_context.thread_count = threads
        for frame in container.decode(stream):
            a = frame.to_ndarray()
            name = frame.format.name
            if not frame.format.is_planar:  # one row of interleaved samples
                a = a.reshape(-1, len(frame.layout.channels)).T
            base = name.rstrip("p")
            if base == "u8":
                a = (a.astype(np.float32) - 128.0) / 128.0
            elif base in _SCALE:
                a = (a / _SCALE[base]).astype(np.float32)
            chunks.append(a.astype(np.float32, copy=False))
            rate = frame.sample_rate
        if rate is None:
            rate, c = stream.codec_context.sample_rate, stream.codec_context.channels
            return np.zeros((c, 0), np.float32), rate
    return np.ascontiguousarray(np.concatenate(chunks, axis=1)), rate


def align(reference: np.ndarray, decoded: np.ndarray, max_lag: int = 4096) -> int:
    """The lag (samples) at which decoded best matches reference (channel 0, cross-correlation
    over the first 2 s): decoded[lag:] ~ reference. Positive: decoded has extra leading
    samples (priming not removed); negative: it lost some."""
    r = np.atleast_2d(reference)[0][:96000].astype(np.float64)
    d = np.atleast_2d(decoded)[0][: 96000 + max_lag].astype(np.float64)
    size = 1 << int(np.ceil(np.log2(len(r) + len(d))))
    corr = np.fft.irfft(np.fft.rfft(d, size) * np.conj(np.fft.rfft(r, size)), size)
    lags = np.arange(-max_lag, max_lag + 1)
    return int(lags[np.argmax(corr[lags % size])])


# ---------------------------------------------------------------- WebDataset


def write_wds_shard(path, samples: Iterable[Dict[str, Union[bytes, str, int]]]) -> str:
    """A WebDataset shard at path: for each sample (a dict with "__key__" and one entry per
    extension, e.g. {"__key__": "000003", "flac": b"...", "cls": 3}), members KEY.EXT in that
    order; str and int values are written as UTF-8 text. Deterministic (mtime 0, no owner)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in samples:
            key = sample["__key__"]
            for ext, value in sample.items():
                if ext == "__key__":
                    continue
                data = value if isinstance(value, bytes) else str(value).encode()
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return str(path)
