"""Reference audio features the audio tests compare chute with, each the real upstream code
(nothing re-implemented here); a reference whose package is missing skips the test, saying so.

- `kaldi_fbank()`: torchaudio's `torchaudio.compliance.kaldi.fbank` (pure torch ops). torchaudio
  2.11 imports with torch >= 2.11; if its package does not import (a native-library mismatch),
  its `compliance/kaldi.py` is loaded on its own, which `fbank` allows (only `mfcc` uses
  another torchaudio module).
- `knf_fbank(...)`: the same features from `kaldi-native-fbank` (Kaldi's C++ code), a second
  opinion that needs no torch.
- `whisper_log_mel(audio, n_mels)`: openai-whisper's features as its README computes them,
  `log_mel_spectrogram(pad_or_trim(audio), n_mels)`. `whisper/audio.py` is loaded without
  `whisper/__init__.py` (which needs tiktoken and numba), so `pip install --no-deps
  openai-whisper` is enough.
- `hf_whisper_features(audio, n_mels)`: transformers' `WhisperFeatureExtractor(feature_size=
  n_mels)`, built directly (no hub download); its torch path, or its numpy path on request.

All take float32 mono audio; the Whisper ones expect 16 kHz and return [n_mels, 3000].
"""

import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable

import numpy as np
import pytest


def _spec_dir(package: str) -> Path:
    """The folder of an installed package, found without importing it; skips if missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def kaldi_fbank() -> Callable:
    """torchaudio.compliance.kaldi.fbank(waveform [C, N] torch tensor, **kaldi options)."""
    pytest.importorskip("torch")
    try:
        import torchaudio.compliance.kaldi as kaldi

        return kaldi.fbank
    except Exception:  # torchaudio's package failed to import: load compliance/kaldi.py alone
        pass
    path = _spec_dir("torchaudio") / "compliance" / "kaldi.py"
    if not path.exists():
        pytest.skip(f"torchaudio has no {path.name}")
    # kaldi.py runs `import torchaudio` at the top; a bare module stands in while it loads.
    saved = sys.modules.get("torchaudio")
    sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    try:
        spec = importlib.util.spec_from_file_location("_ref_torchaudio_kaldi", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["torchaudio"]
        else:
            sys.modules["torchaudio"] = saved
    return module.fbank


def knf_fbank(audio: np.ndarray, sample_rate: int = 16000, n_mels: int = 80,
              dither: float = 0.0, **frame_opts) -> np.ndarray:
    """kaldi-native-fbank's fbank of mono audio (taken as given: scale by 32768 for Kaldi's
    int16 convention), [frames, n_mels] float32. frame_opts: e.g. snip_edges=False."""
    knf = pytest.importorskip("kaldi_native_fbank")
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = sample_rate
    opts.frame_opts.dither = dither
    for k, v in frame_opts.items():
        setattr(opts.frame_opts, k, v)
    opts.mel_opts.num_bins = n_mels
    fb = knf.OnlineFbank(opts)
    fb.accept_waveform(sample_rate, np.asarray(audio, np.float32).tolist())
    fb.input_finished()
    return np.array([fb.get_frame(i) for i in range(fb.num_frames_ready)], np.float32)


_whisper_audio = None


def _load_whisper_audio():
    """openai-whisper's whisper/audio.py (and its whisper/utils.py) as a package of their own
    name, so that `import whisper` elsewhere is untouched and __init__.py never runs."""
    global _whisper_audio
    if _whisper_audio is None:
        pytest.importorskip("torch")
        folder = _spec_dir("whisper")
        if not (folder / "audio.py").exists() or not (folder / "assets" / "mel_filters.npz").exists():
            pytest.skip("the installed `whisper` package is not openai-whisper")
        name = "_ref_openai_whisper"
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]  # `from .utils import exact_div` resolves here
        sys.modules[name] = package
        spec = importlib.util.spec_from_file_location(f"{name}.audio", folder / "audio.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _whisper_audio = module
    return _whisper_audio


def whisper_log_mel(audio: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """openai-whisper's features of 16 kHz mono float32 audio, exactly as its README:
    `pad_or_trim` to 480,000 samples (30 s), then `log_mel_spectrogram(audio, n_mels)`.
    n_mels: 80 or 128 (the two filter banks whisper ships). [n_mels, 3000] float32."""
    import torch

    wa = _load_whisper_audio()
    x = wa.pad_or_trim(torch.from_numpy(np.ascontiguousarray(audio, np.float32)))
    return wa.log_mel_spectrogram(x, n_mels).numpy()


def hf_whisper_features(audio: np.ndarray, n_mels: int = 80, numpy: bool = False) -> np.ndarray:
    """transformers' WhisperFeatureExtractor(feature_size=n_mels) of 16 kHz mono float32 audio
    (padded or cut to 30 s, as it does by default). It takes its torch path when torch is
    installed; numpy=True takes its numpy one. [n_mels, 3000] float32."""
    transformers = pytest.importorskip("transformers")
    fe = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    x = np.ascontiguousarray(audio, np.float32)
    if not numpy:
        return fe(x, sampling_rate=16000, return_tensors="np")["input_features"][0]
    padded = np.zeros(fe.n_samples, np.float32)  # what __call__'s padding gives
    padded[: min(len(x), fe.n_samples)] = x[: fe.n_samples]
    return fe._np_extract_fbank_features(padded[None], "cpu")[0].astype(np.float32)
