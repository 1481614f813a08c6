"""Native audio ops from Python: `decode_audio` of every codec chute reads (bit-exact with
libsndfile for the lossless ones, within the decoders' rounding of FFmpeg's for the lossy ones),
from WebDataset shards, Hugging Face datasets and lists; `resample` against soxr HQ; Whisper's
`log_mel` against openai-whisper and transformers; `fbank` against torchaudio's Kaldi
compliance code; `crop_audio` and `spec_augment` the same for any number of workers; broken and
hostile files reported by key (raise) or counted (skip); bad op specs refused up front.

The clips are short (0.5-3 s) and made by audio_media.py; the references are audio_refs.py's."""

import struct

import numpy as np
import pytest

import chute
from conftest import clean_env, run_python, video_missing

import audio_media as am
import audio_refs as refs

LOSSLESS = ("wav16", "wav24", "wav32", "wavf", "flac16", "flac24", "alac")
# Max abs difference from FFmpeg's decode (measured: vorbis 3e-7, mp3 1.5e-6, aac 3e-6; opus
# 3e-4: FFmpeg decodes Opus with its own decoder, chute with libopus; 2e-7 with
# CHUTE_OPUS_DECODER=ffmpeg in a build with FFmpeg: see test_opus_decoders).
TOLERANCE = {**{c: 0.0 for c in LOSSLESS}, "vorbis": 1e-4, "mp3": 1e-4, "aac": 1e-4,
             "opus": 1e-3, "opus_webm": 1e-3}
RESAMPLE_TOLERANCE = 2e-4  # vs soxr HQ (measured <= 8e-5)
MEL_TOLERANCE = 1e-4  # vs openai-whisper and transformers (measured 4.7e-5)
FBANK_TOLERANCE = 1e-3  # vs torchaudio, on bins within 80 dB of the loudest (measured 3e-4)

DECODE = [{"op": "decode_audio"}]
MONO_16K = [{"op": "decode_audio", "mono": True, "sample_rate": 16000}]


def reference(data, codec):
    """The reference decode of data, (float32 [C, N], rate): libsndfile for the codecs it reads
    (the lossless ones but ALAC, and Ogg Vorbis: libvorbis, trimmed to the last granule
    position; FFmpeg's Ogg demuxer gets the length of mono Vorbis wrong, e.g. 22,400 frames for
    22,050 encoded or 47,872 for 48,000), FFmpeg for ALAC (libsndfile reads no M4A) and the
    other lossy codecs."""
    if codec in LOSSLESS and codec != "alac" or codec == "vorbis":
        return am.soundfile_decode(data)
    return am.ffmpeg_decode(data)


def batches(source, ops, batch_size=1, **kw):
    return list(chute.Loader(source, batch_size=batch_size, transforms=ops, **kw))


def decoded(data, ops=DECODE, field="a"):
    """The one sample chute makes of data (a list source of one sample), batch axis removed."""
    (batch,) = batches([{field: data}], {field: ops})
    return batch[field][0]


def assert_close(got, want, tol, what=""):
    assert got.dtype == np.float32, what
    assert got.shape == want.shape, f"{what}: shape {got.shape}, reference {want.shape}"
    if tol == 0:
        assert np.array_equal(got, want), f"{what}: max diff {np.abs(got - want).max()}"
    else:
        diff = np.abs(got.astype(np.float64) - want).max() if got.size else 0.0
        assert diff <= tol, f"{what}: max abs diff {diff} > {tol}"


def soxr_16k(x, rate):
    """soxr HQ's resampling of [C, N] (or [N]) audio to 16 kHz, float32, the same shape."""
    soxr = pytest.importorskip("soxr")
    if rate == 16000:
        return x
    x = np.asarray(x, np.float32)
    y = soxr.resample(x.T if x.ndim == 2 else x, rate, 16000, quality="HQ")
    return np.ascontiguousarray(y.T if x.ndim == 2 else y, np.float32)


def wav_header(channels=1, rate=16000, bits=16, data_size=None, payload=b"\0" * 1000):
    """A PCM WAV file: a 44-byte header saying channels/rate/bits and a data chunk of data_size
    bytes (default: the payload's length), followed by the payload."""
    block = (channels * bits // 8) & 0xFFFF
    fmt = struct.pack("<HHIIHH", 1, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    size = len(payload) if data_size is None else data_size
    return (b"RIFF" + struct.pack("<I", min(36 + size, 0xFFFFFFFF)) + b"WAVE"
            + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size) + payload)


def shard(tmp_path, samples, name="a.tar"):
    return am.write_wds_shard(tmp_path / name, samples)


# ---------------------------------------------------------------- 1. every codec


def codec_cases():
    for codec in am.CODECS:
        rates = (16000, 48000) if codec.startswith("opus") else (22050, 48000)
        for channels in (1, 2):
            for rate in rates:
                yield pytest.param(codec, channels, rate, id=f"{codec}-{channels}ch-{rate}")


@pytest.mark.parametrize("codec,channels,rate", list(codec_cases()))
def test_every_codec_decodes_as_the_reference_does(codec, channels, rate):
    """decode_audio of each codec, mono and stereo: float32 [C, N] equal to libsndfile's decode
    (lossless) or within the codec's tolerance of FFmpeg's (lossy, the same length); Opus at
    48 kHz whatever rate it was encoded at; mono=True is the mean of the reference's channels."""
    x = am.speech_like(1.0, rate, seed=channels, channels=channels)
    data = am.encode(x, rate, codec)
    want, want_rate = reference(data, codec)
    if codec.startswith("opus"):
        assert want_rate == 48000
    assert want.shape[0] == channels
    tol = TOLERANCE[codec]

    (batch,) = batches([{"a": data}, {"a": data}], {"a": DECODE}, batch_size=2)
    assert batch["a"].shape == (2, *want.shape), "equal lengths stack to [B, C, N]"
    assert_close(batch["a"][0], want, tol, codec)
    assert np.array_equal(batch["a"][0], batch["a"][1])

    mono = decoded(data, [{"op": "decode_audio", "mono": True}])
    assert_close(mono, want.mean(axis=0, dtype=np.float64).astype(np.float32),
                 max(tol, 1e-7), f"{codec} mono")


OPUS_DECODE = """
import sys, numpy as np, chute
data = open(sys.argv[1], "rb").read()
(b,) = list(chute.Loader([{"a": data}], batch_size=1, transforms={"a": [{"op": "decode_audio"}]}))
np.save(sys.argv[2], np.asarray(b["a"][0]))
"""


@pytest.mark.parametrize("channels", [1, 2])
def test_opus_decoders(tmp_path, channels):
    """Opus, both decoders chute has: libopus (the default: within the codec's tolerance of
    FFmpeg's decode, the same length), and, where chute is built with FFmpeg, FFmpeg's own with
    CHUTE_OPUS_DECODER=ffmpeg (equal to FFmpeg's decode, as torchcodec and PyAV give it, within
    1e-6; the same pre-skip and gain handling). Each in a process of its own (the choice is
    made once per process)."""
    x = am.speech_like(3.0, 48000, seed=5, channels=channels)
    data = am.encode(x, 48000, "opus")
    want, _ = reference(data, "opus")
    path = tmp_path / "a.opus"
    path.write_bytes(data)
    decoders = {"libopus": TOLERANCE["opus"]}
    if video_missing() is None:  # chute built with FFmpeg's libraries
        decoders["ffmpeg"] = 1e-6
    for name, tol in decoders.items():
        env = clean_env()
        env.pop("CHUTE_OPUS_DECODER", None)
        if name == "ffmpeg":
            env["CHUTE_OPUS_DECODER"] = "ffmpeg"
        out = tmp_path / f"{name}.npy"
        run_python(OPUS_DECODE, path, out, env=env)
        assert_close(np.load(out), want, tol, f"opus with {name}")


# ---------------------------------------------------------------- 2. WebDataset shards

WDS_AUDIO = [  # (key, extension, codec, rate, channels, seconds)
    ("s0000", "flac", "flac16", 44100, 2, 1.2),
    ("s0001", "mp3", "mp3", 22050, 1, 0.8),
    ("s0002", "opus", "opus", 48000, 2, 1.0),
    ("s0003", "wav", "wav16", 16000, 1, 1.5),
    ("s0004", "m4a", "aac", 44100, 2, 0.9),
    ("s0005", "m4a", "alac", 22050, 1, 0.7),
    ("s0006", "wav", "wavf", 8000, 2, 1.1),
    ("s0007", "flac", "flac24", 48000, 1, 0.6),
]
WDS_FIELDS = "flac;mp3;opus;wav;m4a"


def write_mixed_shard(tmp_path):
    samples, encoded = [], []
    for i, (key, ext, codec, rate, channels, seconds) in enumerate(WDS_AUDIO):
        data = am.encode(am.speech_like(seconds, rate, seed=i, channels=channels), rate, codec)
        samples.append({"__key__": key, ext: data, "cls": i % 3})
        encoded.append(data)
    return shard(tmp_path, samples, "mixed.tar"), encoded


def test_webdataset_shard_of_mixed_codecs_to_whisper_features(tmp_path):
    """A shard of FLAC, MP3, Opus, WAV, AAC and ALAC members (one transform for all their
    extensions, as "audio"): decoded as the references decode them; mono 16 kHz within soxr's
    resampling of the reference's channel mean; log_mel equal to openai-whisper's features of
    that audio; labels from .cls in order."""
    url, encoded = write_mixed_shard(tmp_path)
    n = len(WDS_AUDIO)

    def run(ops):
        got = batches(chute.webdataset([url]), {WDS_FIELDS: {"as": "audio", "ops": ops},
                                                "cls": [{"op": "label"}]}, batch_size=4)
        assert len(got) == 2
        assert [k for b in got for k in b["__key__"]] == [s[0] for s in WDS_AUDIO]
        assert [int(c) for b in got for c in b["cls"]] == [i % 3 for i in range(n)]
        return [a for b in got for a in b["audio"]]

    raw = run(DECODE)
    mono16 = run(MONO_16K)
    mels = run(MONO_16K + [{"op": "log_mel"}])
    for (key, _, codec, rate, channels, _), data, a, m, mel in zip(WDS_AUDIO, encoded, raw,
                                                                 mono16, mels):
        want, want_rate = reference(data, codec)
        assert want.shape[0] == channels
        assert_close(a, want, TOLERANCE[codec], key)
        want16 = soxr_16k(want.mean(axis=0), want_rate)
        assert_close(m, want16, TOLERANCE[codec] + RESAMPLE_TOLERANCE, f"{key} mono 16 kHz")
        assert mel.shape == (80, 3000) and mel.dtype == np.float32
        assert_close(mel, refs.whisper_log_mel(m, 80), MEL_TOLERANCE, f"{key} log_mel")


# ---------------------------------------------------------------- 3. Hugging Face datasets

HF_AUDIO = [("flac16", 44100, 2, 1.0), ("mp3", 22050, 1, 0.7), ("wav16", 16000, 1, 1.3),
            ("vorbis", 22050, 2, 0.9)]


def hf_audio_dataset(columns):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"audio": columns, "label": list(range(len(columns)))})
    return ds.cast_column("audio", datasets.Audio(decode=False))


def hf_encoded():
    return [am.encode(am.speech_like(s, r, seed=i, channels=c), r, codec)
            for i, (codec, r, c, s) in enumerate(HF_AUDIO)]


def check_hf(ds, encoded):
    got = batches(ds, {"audio": DECODE}, batch_size=2)
    assert [int(x) for b in got for x in b["label"]] == list(range(len(HF_AUDIO)))
    audio = [a for b in got for a in b["audio"]]
    for (codec, *_), data, a in zip(HF_AUDIO, encoded, audio):
        assert_close(a, reference(data, codec)[0], TOLERANCE[codec], codec)
    mono = [a for b in batches(ds, {"audio": MONO_16K}, batch_size=4) for a in b["audio"]]
    for (codec, *_), data, a in zip(HF_AUDIO, encoded, mono):
        want, rate = reference(data, codec)
        assert_close(a, soxr_16k(want.mean(axis=0), rate),
                     TOLERANCE[codec] + RESAMPLE_TOLERANCE, f"{codec} mono 16 kHz")


def test_hf_dataset_audio_column_of_bytes():
    """A datasets.Dataset whose Audio(decode=False) column holds {"bytes", "path": None}: chute
    decodes the bytes as the references do; the label column comes along."""
    encoded = hf_encoded()
    check_hf(hf_audio_dataset([{"bytes": b, "path": None} for b in encoded]), encoded)


def test_hf_dataset_audio_column_of_paths_only(tmp_path):
    """An Audio(decode=False) column holding only paths (bytes None), as datasets stores local
    files: chute reads each file at its path and decodes it as the bytes would be.
    NOTE: reading the path when bytes is null is being implemented as this test is written; it
    fails until it is (it is not skipped on purpose)."""
    encoded = hf_encoded()
    paths = []
    for i, ((codec, *_), data) in enumerate(zip(HF_AUDIO, encoded)):
        path = tmp_path / f"clip{i}.{am.EXTENSION[codec]}"
        path.write_bytes(data)
        paths.append(str(path))
    check_hf(hf_audio_dataset([{"bytes": None, "path": p} for p in paths]), encoded)


def write_clips(tmp_path):
    """Clips of several codecs written as files: [(path, codec, bytes)]."""
    out = []
    for i, ((codec, *_), data) in enumerate(zip(HF_AUDIO, hf_encoded())):
        path = tmp_path / f"clip{i}.{am.EXTENSION[codec]}"
        path.write_bytes(data)
        out.append((path, codec, data))
    return out


def test_json_lines_manifest_of_paths(tmp_path, monkeypatch):
    """A JSON Lines manifest of file paths (absolute, and relative to the working directory
    as open() takes them) and labels: decode_audio reads each file on the workers and decodes
    it as the references do; a path to a missing file is an error naming it and the row."""
    import json

    clips = write_clips(tmp_path)
    monkeypatch.chdir(tmp_path)
    rows = [{"path": str(p) if i % 2 else p.name, "label": i} for i, (p, _, _) in enumerate(clips)]
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = [a for b in batches(chute.dataset(str(manifest)), {"path": {"as": "audio", "ops": DECODE}},
                              num_workers=2) for a in b["audio"]]
    assert len(got) == len(clips)
    for (_, codec, data), a in zip(clips, got):
        want, _ = reference(data, codec)
        assert_close(a, want, TOLERANCE[codec], codec)
    rows.append({"path": str(tmp_path / "missing.flac"), "label": 9})
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(chute.CorruptDataError, match="cannot read .*missing.flac"):
        batches(chute.dataset(str(manifest)), {"path": {"as": "audio", "ops": DECODE}})


def test_parquet_and_arrow_binary_columns(tmp_path):
    """Encoded audio in a Parquet file's binary column and an Arrow IPC file's large_binary
    column, written by pyarrow: decoded as the references decode it."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather
    import pyarrow.parquet

    encoded = hf_encoded()
    for name, kind in (("clips.parquet", pa.binary()), ("clips.arrow", pa.large_binary())):
        table = pa.table({"audio": pa.array(encoded, kind), "label": list(range(len(encoded)))})
        path = tmp_path / name
        if name.endswith(".parquet"):
            pyarrow.parquet.write_table(table, path)
        else:
            pyarrow.feather.write_feather(table, path, compression="uncompressed")
        got = [a for b in batches(chute.dataset(str(path)), {"audio": DECODE}) for a in b["audio"]]
        assert len(got) == len(encoded)
        for (codec, *_), data, a in zip(HF_AUDIO, encoded, got):
            want, _ = reference(data, codec)
            assert_close(a, want, TOLERANCE[codec], f"{name}: {codec}")


def test_csv_manifest_through_datasets(tmp_path):
    """A CSV manifest read with datasets.Dataset.from_csv: its path column decodes."""
    datasets = pytest.importorskip("datasets")
    clips = write_clips(tmp_path)
    csv = tmp_path / "train.csv"
    csv.write_text("path,label\n" + "".join(f"{p},{i}\n" for i, (p, _, _) in enumerate(clips)))
    ds = datasets.Dataset.from_csv(str(csv), cache_dir=str(tmp_path / "cache"))
    got = [a for b in batches(ds, {"path": {"as": "audio", "ops": DECODE}}) for a in b["audio"]]
    for (_, codec, data), a in zip(clips, got):
        want, _ = reference(data, codec)
        assert_close(a, want, TOLERANCE[codec], codec)


# ---------------------------------------------------------------- 4. crops, padding, workers


def clip(seconds, rate=16000, channels=1, seed=0, codec="wav16"):
    """(encoded bytes, the audio they decode to, float32 [C, N])."""
    data = am.encode(am.speech_like(seconds, rate, seed=seed, channels=channels), rate, codec)
    return data, am.soundfile_decode(data)[0]


def test_crop_audio_from_the_start_and_padded_when_short():
    """crop_audio without random: the first N frames (seconds or samples), a mask of all true;
    shorter audio zero-padded to N with the mask false over the padding; mono too."""
    long, long_audio = clip(1.0, channels=2)
    short, short_audio = clip(0.5, channels=2, seed=1)
    ops = {"a": DECODE + [{"op": "crop_audio", "seconds": 0.75}]}
    (b,) = batches([{"a": long}, {"a": short}], ops, batch_size=2)
    assert b["a"].shape == (2, 2, 12000) and b["a_mask"].shape == (2, 2, 12000)
    assert b["a_mask"].dtype == np.bool_
    assert np.array_equal(b["a"][0], long_audio[:, :12000]) and b["a_mask"][0].all()
    assert np.array_equal(b["a"][1, :, :8000], short_audio)
    assert not b["a"][1, :, 8000:].any()
    assert b["a_mask"][1, :, :8000].all() and not b["a_mask"][1, :, 8000:].any()

    ops = {"a": [{"op": "decode_audio", "mono": True}, {"op": "crop_audio", "samples": 10000}]}
    (b,) = batches([{"a": long}, {"a": short}], ops, batch_size=2)
    assert b["a"].shape == (2, 10000) and b["a_mask"].shape == (2, 10000)
    assert np.allclose(b["a"][0], long_audio.mean(0)[:10000], atol=1e-7)
    assert b["a_mask"][0].all() and b["a_mask"][1].sum() == 8000


def test_random_crop_is_a_slice_of_the_audio_at_varying_offsets():
    """crop_audio random: each crop is audio[:, o:o + N] for some o, the mask all true, and the
    offsets differ between samples."""
    data, audio = clip(1.0)
    n = 4000
    ops = {"a": DECODE + [{"op": "crop_audio", "samples": n, "random": True}]}
    got = batches([{"a": data}] * 12, ops, batch_size=4, seed=5)
    offsets = set()
    windows = np.lib.stride_tricks.sliding_window_view(audio[0], n)
    for b in got:
        assert b["a"].shape == (4, 1, n) and b["a_mask"].all()
        for crop in b["a"]:
            (match,) = np.nonzero((windows == crop[0]).all(axis=1))
            assert len(match) >= 1, "a crop is a slice of the audio"
            offsets.add(int(match[0]))
    assert len(offsets) > 3, offsets


def test_differing_lengths_come_as_a_list_or_padded_with_a_mask():
    """Decoded audio of differing lengths: a list of [C, N] arrays; with pad=True a zero-padded
    [B, C, Nmax] and a bool mask of the same shape, true over each clip's frames."""
    clips = [clip(s, channels=2, seed=i) for i, s in enumerate((0.5, 0.8, 0.6))]
    source = [{"a": d} for d, _ in clips]
    (b,) = batches(source, {"a": DECODE}, batch_size=3)
    assert [x.shape for x in b["a"]] == [(2, 8000), (2, 12800), (2, 9600)]
    for got, (_, want) in zip(b["a"], clips):
        assert np.array_equal(got, want)
    (b,) = batches(source, {"a": DECODE}, batch_size=3, pad=True)
    assert b["a"].shape == (3, 2, 12800) and b["a_mask"].shape == (3, 2, 12800)
    assert b["a_mask"].dtype == np.bool_
    for k, (_, want) in enumerate(clips):
        n = want.shape[1]
        assert np.array_equal(b["a"][k, :, :n], want)
        assert b["a_mask"][k, :, :n].all() and b["a_mask"][k].sum() == 2 * n
        assert not b["a"][k][~b["a_mask"][k]].any()


AUGMENT = {"wav": {"as": "audio", "ops": MONO_16K + [
    {"op": "crop_audio", "seconds": 0.5, "random": True},
    {"op": "log_mel", "n_samples": None},
    {"op": "spec_augment", "freq_width": 15, "time_width": 10},
]}, "cls": [{"op": "label"}]}


def write_clip_shards(tmp_path, n=24, per_shard=8):
    urls = []
    for s in range(0, n, per_shard):
        samples = []
        for i in range(s, s + per_shard):
            data, _ = clip(0.6 + 0.05 * (i % 7), rate=(16000, 22050)[i % 2], seed=i)
            samples.append({"__key__": f"c{i:04d}", "wav": data, "cls": i % 4})
        urls.append(shard(tmp_path, samples, f"clips-{s // per_shard}.tar"))
    return urls


def test_random_crop_and_spec_augment_the_same_for_any_number_of_workers(tmp_path):
    """decode + random crop + log_mel + spec_augment, shuffled: the same batches (features,
    masks, labels) for 1 and 4 workers; another seed or epoch crops elsewhere."""
    urls = write_clip_shards(tmp_path)
    runs = {}
    for workers in (1, 4):
        loader = chute.Loader(chute.webdataset(urls), batch_size=8, shuffle=True, seed=3,
                              num_workers=workers, transforms=AUGMENT)
        runs[workers] = list(loader)
    assert len(runs[1]) == 3
    first = runs[1][0]
    assert first["audio"].shape == (8, 80, 50) and first["audio"].dtype == np.float32
    for a, b in zip(runs[1], runs[4]):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
    # spec_augment masked something: some rows and columns are exactly 0 (its value).
    assert any((f == 0).all(axis=1).any() or (f == 0).all(axis=0).any() for f in first["audio"])

    crop = {"wav": {"as": "audio", "ops": MONO_16K + [
        {"op": "crop_audio", "seconds": 0.5, "random": True}]}}

    def crops(seed, epoch=0):
        loader = chute.Loader(chute.webdataset(urls), batch_size=8, shuffle=False, seed=seed,
                              transforms=crop)
        loader.set_epoch(epoch)
        return np.concatenate([b["audio"] for b in loader])

    base = crops(0)
    assert np.array_equal(base, crops(0))
    assert not np.array_equal(base, crops(1))
    assert not np.array_equal(base, crops(0, epoch=1))


# ---------------------------------------------------------------- 5. features and resampling


def speech_16k(seconds=2.5, seed=0, channels=1):
    """16 kHz speech-like audio as WAV float (chute decodes it bit-exact): (bytes, [C, N])."""
    x = am.speech_like(seconds, 16000, seed=seed, channels=channels)
    return am.encode(x, 16000, "wavf"), x


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_equals_openai_whisper_and_transformers(n_mels):
    """log_mel of 16 kHz mono audio: [n_mels, 3000] within 1e-4 of openai-whisper's
    log_mel_spectrogram(pad_or_trim(audio)) and of transformers' WhisperFeatureExtractor."""
    data, x = speech_16k()
    mel = decoded(data, DECODE + [{"op": "log_mel", "n_mels": n_mels}])
    assert mel.shape == (n_mels, 3000)
    assert_close(mel, refs.whisper_log_mel(x[0], n_mels), MEL_TOLERANCE, "openai-whisper")
    assert_close(mel, refs.hf_whisper_features(x[0], n_mels), MEL_TOLERANCE, "transformers")


def test_log_mel_without_padding_is_len_over_160_frames():
    """log_mel with n_samples null: [n_mels, len // 160], openai-whisper's log_mel_spectrogram
    of the unpadded audio."""
    import torch

    data, x = speech_16k(1.37)
    mel = decoded(data, DECODE + [{"op": "log_mel", "n_samples": None}])
    assert mel.shape == (80, x.shape[1] // 160)
    want = refs._load_whisper_audio().log_mel_spectrogram(torch.from_numpy(x[0]), 80).numpy()
    assert_close(mel, want, MEL_TOLERANCE, "openai-whisper, unpadded")


def test_log_mel_refuses_audio_not_16k_mono():
    """log_mel of 44.1 kHz audio (or stereo 16 kHz): an error saying it takes 16 kHz mono."""
    data, _ = clip(1.0, rate=44100)
    with pytest.raises((chute.CorruptDataError, chute.ConfigError), match="16 kHz"):
        decoded(data, DECODE + [{"op": "log_mel"}])
    data, _ = speech_16k(1.0, channels=2)
    with pytest.raises((chute.CorruptDataError, chute.ConfigError), match="16 kHz"):
        decoded(data, DECODE + [{"op": "log_mel"}])


FBANK_CASES = {  # id: (rate, channels, chute's options; torchaudio's are these less "scale")
    "defaults": (16000, 1, {}),
    "80-bins-int16-scale": (16000, 1, {"num_mel_bins": 80, "scale": 32768}),
    "no-snip-edges-energy-stereo": (16000, 2, {"snip_edges": False, "use_energy": True}),
    "8k-40-bins": (8000, 1, {"num_mel_bins": 40, "scale": 32768}),
}


@pytest.mark.parametrize("case", list(FBANK_CASES))
def test_fbank_equals_torchaudio_kaldi(case):
    """fbank: [frames, bins] at the audio's own rate (channel 0 of stereo), within 1e-3 of
    torchaudio.compliance.kaldi.fbank on every bin within 80 dB of the loudest (below that
    both are float32 rounding noise)."""
    import torch

    rate, channels, opts = FBANK_CASES[case]
    x = am.speech_like(2.0, rate, seed=4, channels=channels)
    data = am.encode(x, rate, "wavf")
    got = decoded(data, DECODE + [{"op": "fbank", **opts}])
    ref_opts = {k: v for k, v in opts.items() if k != "scale"}
    wave = torch.from_numpy(x * np.float32(opts.get("scale", 1)))
    want = refs.kaldi_fbank()(wave, sample_frequency=rate, **ref_opts).numpy()
    assert got.dtype == np.float32 and got.shape == want.shape, (got.shape, want.shape)
    loud = want >= want.max() - np.log(1e8)
    assert loud.mean() > 0.3, "a good part of the bins are compared"
    diff = np.abs(got - want)[loud].max()
    assert diff <= FBANK_TOLERANCE, f"max abs diff {diff} on loud bins"


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
@pytest.mark.parametrize("signal", ["speech", "sine"])
def test_resample_to_16k_equals_soxr_hq(rate, signal):
    """resample (and decode_audio's sample_rate) to 16 kHz: the length soxr gives, within 2e-4
    of soxr.resample(quality="HQ") inside the clip; within 1e-3 at its first and last two
    samples, where a signal that does not start or end in silence rings through each
    filter's own edge (the filters differ in their transition band, not their passband)."""
    if signal == "speech":
        x = am.speech_like(1.0, rate, seed=2)
    else:
        x = am.sine(1.0, rate, freqs=(997.0,), amplitude=0.8)
    data = am.encode(x, rate, "wavf")
    want = soxr_16k(x, rate)
    got = decoded(data, DECODE + [{"op": "resample", "sample_rate": 16000}])
    assert_close(got[..., 2:-2], want[..., 2:-2], RESAMPLE_TOLERANCE, f"{signal} {rate} Hz")
    assert_close(got, want, 1e-3, f"{signal} {rate} Hz, edges included")
    in_decode = decoded(data, [{"op": "decode_audio", "sample_rate": 16000}])
    assert_close(in_decode, got, 1e-6, "decode_audio's sample_rate vs resample")



@pytest.mark.parametrize("frames", [1001, 12345, 39936])
@pytest.mark.parametrize("rate", [22050, 44100])
def test_resampled_length_is_soxrs_when_the_ratio_leaves_a_fraction(rate, frames):
    """Resampling a length whose 16 kHz equivalent is not whole (1001 frames at 44.1 kHz are
    363.17 at 16 kHz; 39,936 are 14,489.25, the length of an AAC clip): soxr's length (it
    rounds to the nearest) and its values within 2e-4."""
    x = am.speech_like(frames / rate, rate, seed=frames)
    assert x.shape[1] == frames
    want = soxr_16k(x, rate)
    got = decoded(am.encode(x, rate, "wavf"), [{"op": "decode_audio", "sample_rate": 16000}])
    assert_close(got, want, RESAMPLE_TOLERANCE, f"{frames} frames at {rate} Hz")

# ---------------------------------------------------------------- 6. bad and hostile data


def truncated(codec, rate=None):
    rate = rate or (48000 if codec.startswith("opus") else 22050)
    data = am.encode(am.speech_like(2.0, rate, seed=7, channels=2), rate, codec)
    return data[: len(data) // 2]


BAD = {  # key: (extension, bytes, what the error says)
    "garbage": ("wav", b"\x00\x01garbage" * 50, "not audio"),
    "cut-flac": ("flac", truncated("flac16"), "truncated"),
    "cut-mp3": ("mp3", truncated("mp3"), ""),
    "cut-vorbis": ("ogg", truncated("vorbis"), "truncated"),
    "cut-opus": ("opus", truncated("opus"), "truncated"),
    "wav-huge-rate": ("wav", wav_header(rate=2_000_000_000), "rate"),
    "wav-1000-channels": ("wav", wav_header(channels=1000), ""),
    "wav-65535-channels": ("wav", wav_header(channels=65535), ""),
}
BAD_OPS = {"wav;flac;mp3;ogg;opus": {"as": "audio", "ops": DECODE}, "cls": [{"op": "label"}]}


@pytest.mark.parametrize("size", [0xFFFFFFFF, 0, 0xFFFFFF00])
def test_wav_data_sizes_that_do_not_fit_are_read_to_the_end(size):
    """A WAV whose data size is a placeholder (0 or 0xFFFFFFFF, as a tool writing to a pipe
    leaves it) or more than the file holds: the samples that are there, as FFmpeg reads them
    (and libsndfile, but for a size of 0, where it reads none)."""
    x = am.sine(0.25, 16000)
    data = bytearray(am.encode(x, 16000, "wav16"))
    at = data.index(b"data")
    data[at + 4:at + 8] = struct.pack("<I", size)
    data[4:8] = struct.pack("<I", 0xFFFFFFFF)
    want, _ = am.soundfile_decode(am.encode(x, 16000, "wav16"))
    assert_close(decoded(bytes(data)), want, 0.0, f"data size {size:#x}")


@pytest.mark.parametrize("key", list(BAD))
def test_bad_audio_raises_naming_its_key(tmp_path, key):
    """Garbage, a file cut in the middle (FLAC, MP3, Vorbis, Opus; FFmpeg refuses the MP3 too),
    a WAV claiming ~4 GiB of data it lacks, a rate or channel count beyond reason: a
    CorruptDataError naming the sample's key."""
    ext, data, says = BAD[key]
    good, _ = clip(0.5)
    url = shard(tmp_path, [{"__key__": "fine", "wav": good, "cls": 0},
                           {"__key__": key, ext: data, "cls": 1}])
    with pytest.raises(chute.CorruptDataError, match=key) as e:
        batches(chute.webdataset([url]), BAD_OPS)
    assert says in str(e.value)


def test_bad_audio_is_skipped_and_counted(tmp_path):
    """The same bad samples among good ones with on_error="skip": every batch full, each bad
    sample counted once."""
    samples = []
    for i in range(16 - len(BAD)):  # 16 in all: four full batches
        samples.append({"__key__": f"good{i}", "wav": clip(0.5, seed=i)[0], "cls": i})
    for j, (key, (ext, data, _)) in enumerate(BAD.items()):
        samples.insert(2 * j + 1, {"__key__": key, ext: data, "cls": 100})
    url = shard(tmp_path, samples)
    loader = chute.Loader(chute.webdataset([url]), batch_size=4, transforms=BAD_OPS,
                          on_error="skip", num_workers=2)
    got = list(loader)
    assert [len(b["cls"]) for b in got] == [4, 4, 4, 4], "the batches stay full"
    assert all(int(c) < 100 for b in got for c in b["cls"]), "no bad sample comes through"
    assert loader.stats()["skipped"] == len(BAD)


def test_audio_over_max_seconds_or_max_channels_is_refused(tmp_path):
    """decode_audio's max_seconds and max_channels: a longer clip or one of more channels is a
    CorruptDataError naming the key and the limit (skipped and counted with on_error="skip");
    raising the limit reads it."""
    long, _ = clip(2.0, channels=2)
    short, _ = clip(0.5, seed=1)
    url = shard(tmp_path, [{"__key__": "short", "wav": short}, {"__key__": "long", "wav": long}])
    for op, says in (({"max_seconds": 1.5}, "max_seconds"), ({"max_channels": 1}, "channel")):
        ops = {"wav": [{"op": "decode_audio", **op}]}
        with pytest.raises(chute.CorruptDataError, match="long") as e:
            batches(chute.webdataset([url]), ops)
        assert says in str(e.value), str(e.value)
        loader = chute.Loader(chute.webdataset([url]), batch_size=1, transforms=ops,
                              on_error="skip")
        assert len(list(loader)) == 2 and loader.stats()["skipped"] == 1
    assert len(batches(chute.webdataset([url]), {"wav": [{"op": "decode_audio",
                                                            "max_seconds": 2.5}]})) == 2


HOSTILE = """
    import resource, sys, chute
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000_000, 2_000_000_000))
    url = sys.argv[1]
    try:
        loader = chute.Loader(chute.webdataset([url]), batch_size=1, on_error="skip",
                              transforms={"wav;flac": [{"op": "decode_audio"}]})
        n = sum(1 for _ in loader)
        print("read", n, "skipped", loader.stats()["skipped"], flush=True)
    except BaseException as e:
        print("error", type(e).__name__, e, flush=True)
"""


def hostile_flac():
    """A FLAC whose STREAMINFO claims 2^36 - 1 samples (6.5 weeks at 12 kHz), 16 bits: the
    frames are 0.5 s of audio."""
    data = bytearray(am.encode(am.speech_like(0.5, 12000), 12000, "flac16"))
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    info = 8  # its 34 bytes: 10 of block/frame sizes, then rate:20 channels:3 bits:5 total:36
    packed = int.from_bytes(data[info + 10:info + 18], "big")
    packed |= (1 << 36) - 1
    data[info + 10:info + 18] = packed.to_bytes(8, "big")
    return bytes(data)


HOSTILE_FILES = {
    "wav-4gib-float-stereo": ("wav", wav_header(channels=2, rate=768000, bits=32,
                                                data_size=0xFFFFFFF0, payload=b"\0" * 4096)),
    "wav-65535-channels": ("wav", wav_header(channels=65535, data_size=0xFFFFFFF0)),
    "flac-2pow36-samples": ("flac", hostile_flac()),
}


@pytest.mark.parametrize("key", list(HOSTILE_FILES))
def test_hostile_audio_headers_under_a_2gb_address_space(tmp_path, key):
    """Headers claiming gigabytes (a 4 GiB stereo float WAV at 768 kHz, 65,535 channels, a FLAC
    of 2^36 samples), decoded in a fresh process limited to 2 GB of address space: what the
    bytes hold read, or skipped as corrupt; no MemoryError, no abort."""
    ext, data = HOSTILE_FILES[key]
    url = shard(tmp_path, [{"__key__": "fine", "wav": clip(0.5)[0]}, {"__key__": key, ext: data}])
    out = run_python(HOSTILE, url, timeout=120)
    line = out.stdout.strip()
    # The 4 GiB WAV is read to its end, as soundfile and FFmpeg read a data size that does not
    # fit; 65,535 channels are refused. The FLAC's frames decode; its count may be believed
    # (over max_seconds: corrupt) or not (0.5 s read).
    allowed = {"read 2 skipped 1"} | ({"read 2 skipped 0"} if ext == "flac" else set())
    if key == "wav-4gib-float-stereo":
        allowed = {"read 2 skipped 0"}
    assert line in allowed, f"{line}\n{out.stderr[-2000:]}"
    assert "MemoryError" not in out.stderr and "memory allocation" not in out.stderr


# ---------------------------------------------------------------- 7. bad op specs


@pytest.mark.parametrize("ops,says", [
    ([{"op": "decode_audio", "sample_rate": 0}], "sample_rate 0"),
    (DECODE + [{"op": "crop_audio", "seconds": 1.0, "samples": 100}], "seconds .* or samples"),
    (DECODE + [{"op": "crop_audio"}], "seconds .* or samples"),
    ([{"op": "log_mel"}], "log_mel needs decoded audio"),
    (DECODE + [{"op": "spec_augment"}], "spec_augment needs speech features"),
    (DECODE + [{"op": "resample", "sample_rate": 10_000_000}], "sample_rate"),
    (DECODE + [{"op": "log_mel", "n_mels": 0}], "n_mels"),
    ([{"op": "decode_audio", "max_seconds": -1}], "max_seconds"),
    ([{"op": "decode_audio", "max_channels": 0}], "max_channels"),
], ids=["rate-0", "seconds-and-samples", "no-length", "log-mel-first", "augment-audio",
        "resample-10MHz", "no-mels", "negative-seconds", "no-channels"])
def test_bad_audio_op_specs_are_config_errors(ops, says):
    """Impossible audio op specs: a ConfigError naming the field, op and what is wrong, before
    any data is read."""
    with pytest.raises(chute.ConfigError, match=says) as e:
        chute.Loader([{"a": b"never read"}], batch_size=1, transforms={"a": ops})
    assert 'field "a"' in str(e.value)
