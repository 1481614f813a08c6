"""`decode_video` from Python against torchcodec (the same system FFmpeg 5.1 libraries): frames
at given indices identical to `VideoDecoder(data, seek_mode="exact").get_frames_at(indices)`,
pts equal, for H.264, H.265, VP9, AV1 and MPEG-4 in MP4, MKV, WebM, MPEG-TS and AVI; clips
sampled at regular and random indices (torchcodec's `clips_at_regular_indices` /
`clips_at_random_indices` rules) and at times (`fps`); the end-of-video policies; resize and
crops; WebDataset shards, Parquet, Hugging Face datasets and manifests of paths; broken and
hostile files reported by key (raise) or counted (skip); bad op specs refused up front.

The videos (30-48 frames, 96x64 to 320x240) are made by video_media.py; every frame carries its
own number in a band at the top (`video_media.frame_number`), so a clip says which frames it
holds without any reference decoder.

MPEG-TS: torchcodec 0.17 on FFmpeg 5.1 seeks to the wrong frame in a TS file (frame 0 comes
back as frame 12, one GOP late, and frames of the last GOPs fail with "no more frames": FFmpeg's
timestamp seek in a container without an index lands after the keyframe). The reference for TS
is PyAV's sequential decode of every frame instead (bit-identical to torchcodec's frames for
every other case here), and the frame numbers.

The whole module is skipped when chute was built without the cargo feature `video` or torchcodec
(or the FFmpeg libraries it loads) is missing.
"""

import functools
import json
from typing import List, NamedTuple, Optional

import numpy as np
import pytest

import chute
from conftest import run_python, video_missing

import video_media as vm

torch = pytest.importorskip("torch")


def _torchcodec_missing() -> Optional[str]:
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads FFmpeg's libraries)
    except Exception as e:  # ImportError, or RuntimeError/OSError without FFmpeg's .so files
        return f"torchcodec unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


_why = _torchcodec_missing() or video_missing()
if _why:
    pytest.skip(_why, allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from torchcodec.samplers import clips_at_regular_indices  # noqa: E402

# Mean absolute difference allowed between chute's resize (+ crop) and torch's bilinear
# interpolation with antialias (torchvision's Resize on tensors) of torchcodec's frames, on 0..255.
RESIZE_TOLERANCE = 4.0
PTS_TOLERANCE = 1e-9  # seconds: "equal" (both are pts * time_base in float64)
VIDEO_KEYS = "mp4;mkv;webm;avi;ts"


# ---------------------------------------------------------------- media and references


def media(name: str, frames: Optional[int] = None) -> bytes:
    """A case's bytes (frames: another frame count), encoded once per run: the encoders do not
    give the same bytes on every call (libx264 here differs in the first GOP now and then, even
    on one thread), so every test and every reference must decode the one copy. The cache's key
    is normalized: `media(name)` and `media(name, None)` are the same video."""
    return _media(name, vm.CASES[name].frames if frames is None else frames)


@functools.lru_cache(maxsize=None)
def _media(name: str, frames: int) -> bytes:
    case = vm.CASES[name]
    if not vm.available(case):
        pytest.skip(vm.missing_reason(case))
    return vm.encode(case, frames)


class Ref(NamedTuple):
    frames: np.ndarray  # uint8 [N, H, W, 3], every frame in presentation order
    pts: np.ndarray  # float64 [N] seconds
    durations: Optional[np.ndarray]  # float64 [N] seconds (torchcodec's; None for TS)
    begin: float  # the first frame's pts
    end: float  # the last frame's pts + its duration


def reference(name: str, frames: Optional[int] = None) -> Ref:
    """Every frame of a case: torchcodec's (exact mode), or PyAV's sequential decode for
    MPEG-TS (see the module's docstring), of the bytes `media(name, frames)` gives."""
    return _reference(name, vm.CASES[name].frames if frames is None else frames)


@functools.lru_cache(maxsize=None)
def _reference(name: str, frames: int) -> Ref:
    data = media(name, frames)
    if vm.CASES[name].container == "mpegts":
        decoded = vm.pyav_frames(data)
        pts = np.array([p for _, p in decoded], np.float64)
        step = 1 / float(vm.CASES[name].fps)
        return Ref(np.stack([f for f, _ in decoded]), pts, None, pts[0], pts[-1] + step)
    dec = vm.torchcodec_decoder(data)
    md = dec.metadata
    fb = dec.get_frames_at(indices=list(range(md.num_frames)))
    return Ref(np.ascontiguousarray(fb.data.permute(0, 2, 3, 1).numpy()),
               fb.pts_seconds.numpy().astype(np.float64),
               fb.duration_seconds.numpy().astype(np.float64),
               float(md.begin_stream_seconds), float(md.end_stream_seconds))


def numbers(clip: np.ndarray) -> List[int]:
    """The frame numbers of a clip [T, H, W, 3] at native size."""
    return [vm.frame_number(f) for f in clip]


# ---------------------------------------------------------------- chute helpers


def video_op(**params):
    return {"op": "decode_video", **params}


def transforms(field="video", **params):
    # A Python dataset's fields keep their names (chute rebuilds default_collate's structure
    # from them): the op's output replaces the field, with "video_pts" beside it.
    if field == "video":
        return {field: [video_op(**params)]}
    return {field: {"as": "video", "ops": [video_op(**params)]}}


def loader(source, batch_size=1, field="video", loader_kw=None, **params):
    return chute.Loader(source, batch_size=batch_size, transforms=transforms(field, **params),
                        **(loader_kw or {}))


def rows(batch, name="video") -> List[np.ndarray]:
    """A batch column as a list of per-sample arrays (one stacked array, or a list when the
    shapes differ)."""
    return [np.asarray(x) for x in batch[name]]


def clips_of(source, batch_size=1, loader_kw=None, **params):
    """(videos, pts) of every sample of one epoch, in order."""
    videos, pts = [], []
    for batch in loader(source, batch_size, loader_kw=loader_kw, **params):
        videos += rows(batch, "video")
        pts += rows(batch, "video_pts")
    return videos, pts


def one(data: bytes, **params):
    """The one sample chute makes of data: (video, pts), the batch axis removed."""
    (batch,) = list(loader([{"video": data}], **params))
    video, pts = np.asarray(batch["video"])[0], np.asarray(batch["video_pts"])[0]
    assert video.dtype == np.uint8, video.dtype
    assert pts.dtype == np.float64, pts.dtype
    return video, pts


def shard(tmp_path, samples, name="videos.tar"):
    return vm.write_wds_shard(tmp_path / name, samples)


def assert_frames(got, want, what=""):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, reference {want.shape}"
    if not np.array_equal(got, want):
        bad = [i for i in range(len(got)) if not np.array_equal(got[i], want[i])]
        diff = np.abs(got.astype(np.int16) - want).max()
        raise AssertionError(f"{what}: frames {bad} differ (max abs diff {diff})")


def assert_pts(got, want, what=""):
    assert got.shape == want.shape, f"{what}: pts shape {got.shape}, reference {want.shape}"
    assert np.allclose(got, want, rtol=0, atol=PTS_TOLERANCE), f"{what}: pts {got} != {want}"


# ---------------------------------------------------------------- 1. every codec and container

CASE_NAMES = list(vm.CASES)


def probe_indices(n: int) -> List[int]:
    """Out of order, repeated, across GOPs (of 12), first and last."""
    return [0, n - 1, 5, 13, 13, 2, n // 2, 12, 11, n - 2]


@pytest.mark.parametrize("layout", ["THWC", "TCHW"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_frames_at_indices_equal_torchcodec(name, layout):
    """decode_video with indices, native size: exactly those frames, in that order, identical to
    torchcodec's get_frames_at(indices) (exact seek mode) and their pts equal its pts_seconds;
    uint8 [T, H, W, 3] (THWC) or [T, 3, H, W] (TCHW). Each frame's own number agrees."""
    case = vm.CASES[name]
    data = media(name)
    ref = reference(name)
    n = len(ref.pts)
    assert n == case.frames, f"the reference counts {n} frames of {case.frames}"
    indices = probe_indices(n)
    if case.container == "mpegts":
        want, want_pts = ref.frames[indices], ref.pts[indices]
    else:
        want, want_pts = vm.torchcodec_frames(data, indices)
    assert numbers(want) == indices, "the reference's frames are the ones asked for"

    got, pts = one(data, indices=indices, layout=layout)
    if layout == "TCHW":
        assert got.shape == (len(indices), 3, case.height, case.width), got.shape
        got = np.ascontiguousarray(np.moveaxis(got, 1, -1))
    assert got.shape == (len(indices), case.height, case.width, 3), got.shape
    assert numbers(got) == indices, name
    assert_frames(got, want, name)
    assert_pts(pts, want_pts, name)


def test_equal_shapes_stack_into_one_array():
    """Two samples of the same video and indices: one array [2, T, H, W, 3], pts [2, T]."""
    data = media("h264-mkv")
    (batch,) = list(loader([{"video": data}, {"video": data}], batch_size=2, indices=[3, 1, 4]))
    video, pts = batch["video"], batch["video_pts"]
    assert isinstance(video, np.ndarray) and video.shape == (2, 3, 64, 96, 3), video.shape
    assert pts.shape == (2, 3) and pts.dtype == np.float64
    assert np.array_equal(video[0], video[1])
    assert numbers(video[0]) == [3, 1, 4]


# ---------------------------------------------------------------- 2. regular index sampling


def complete(indices: List[int], frames: int, policy: str) -> List[int]:
    if len(indices) >= frames:
        return indices
    if policy == "repeat_last":
        return indices + [indices[-1]] * (frames - len(indices))
    if policy == "wrap":
        return (indices * (frames // len(indices) + 1))[:frames]
    raise ValueError("policy error: the clip runs past the end")


def regular_indices(n, frames, clips, stride, policy="repeat_last") -> List[List[int]]:
    """The documented rule (torchcodec's clips_at_regular_indices): clip starts
    linspace(0, end - 1, clips) as int, end = max(n - span + 1, 1), span = stride*(frames-1)+1;
    a clip is range(start, min(start + span, n), stride) completed by the policy."""
    span = stride * (frames - 1) + 1
    end = max(n - span + 1, 1)
    starts = torch.linspace(0, end - 1, steps=clips, dtype=torch.int).tolist()
    return [complete(list(range(s, min(s + span, n), stride)), frames, policy) for s in starts]


REGULAR = [  # (frames, clips, stride)
    (8, 3, 2),
    (4, 1, 1),
    (5, 40, 3),  # more clips than starts: repeated starts, as torch.linspace gives
]


@pytest.mark.parametrize("frames,clips,stride", REGULAR, ids=["8x3-stride2", "4x1", "5x40-stride3"])
@pytest.mark.parametrize("name", ["h264-mp4", "vp9-webm", "hevc-mkv"])
def test_regular_clips_follow_the_rule_and_equal_torchcodecs_sampler(name, frames, clips, stride):
    """sampler "regular": the clips of the documented rule, computed here; their frames and pts
    those torchcodec's clips_at_regular_indices returns. [clips, T, H, W, 3] and pts
    [clips, T] for clips > 1, [T, H, W, 3] and [T] for one clip."""
    case = vm.CASES[name]
    data, ref = media(name), reference(name)
    want_idx = regular_indices(len(ref.pts), frames, clips, stride)
    tc = clips_at_regular_indices(vm.torchcodec_decoder(data), num_clips=clips,
                                  num_frames_per_clip=frames, num_indices_between_frames=stride)
    tc_frames = tc.data.permute(0, 1, 3, 4, 2).numpy()
    tc_pts = tc.pts_seconds.numpy()
    assert [numbers(c) for c in tc_frames] == want_idx, "torchcodec follows the rule"

    got, pts = one(data, frames=frames, clips=clips, stride=stride, sampler="regular")
    if clips == 1:
        assert got.shape == (frames, case.height, case.width, 3) and pts.shape == (frames,)
        got, pts = got[None], pts[None]
    assert got.shape == (clips, frames, case.height, case.width, 3), got.shape
    assert pts.shape == (clips, frames), pts.shape
    assert [numbers(c) for c in got] == want_idx
    for k in range(clips):
        assert_frames(got[k], tc_frames[k], f"{name} clip {k}")
        assert_pts(pts[k], tc_pts[k], f"{name} clip {k}")


# ---------------------------------------------------------------- 3. random index sampling

RANDOM_VIDEOS = ["h264-mp4", "h264-mkv", "vp9-webm", "hevc-mp4"]
RANDOM = dict(frames=6, clips=2, stride=3, sampler="random")


def random_source(n=12):
    return [{"video": media(RANDOM_VIDEOS[i % len(RANDOM_VIDEOS)])} for i in range(n)]


def check_random_clip(name, clip, pts, frames, stride):
    """A clip is valid under the rule: indices start + k*stride (k < frames), the start in
    [0, max(N - span + 1, 1)), the frames and pts those of the reference. Returns the start."""
    ref = reference(name)
    n = len(ref.pts)
    idx = numbers(clip)
    span = stride * (frames - 1) + 1
    start = idx[0]
    assert 0 <= start < max(n - span + 1, 1), f"{name}: start {start} of {n} frames, span {span}"
    assert idx == [start + k * stride for k in range(frames)], f"{name}: {idx}"
    assert_frames(clip, ref.frames[idx], name)
    assert_pts(pts, ref.pts[idx], name)
    return start


def test_random_clips_are_valid_and_the_same_for_any_number_of_workers():
    """sampler "random", 2 clips of 6 frames, stride 3, over 12 samples of 4 videos: every clip
    valid under the rule (its frames and pts the reference's); the same batches for 1 and 4
    workers; the starts vary."""
    source = random_source()
    runs = {}
    for workers in (1, 4):
        kw = {"seed": 7, "num_workers": workers}
        runs[workers] = clips_of(source, batch_size=4, loader_kw=kw, **RANDOM)
    videos, pts = runs[1]
    assert len(videos) == len(source)
    starts = set()
    for i, (v, p) in enumerate(zip(videos, pts)):
        name = RANDOM_VIDEOS[i % len(RANDOM_VIDEOS)]
        case = vm.CASES[name]
        assert v.shape == (2, 6, case.height, case.width, 3) and p.shape == (2, 6), v.shape
        for k in range(2):
            starts.add((name, check_random_clip(name, v[k], p[k], 6, 3)))
    assert len(starts) > 8, f"the starts vary: {sorted(starts)}"
    for a, b, pa, pb in zip(runs[1][0], runs[4][0], runs[1][1], runs[4][1]):
        assert np.array_equal(a, b) and np.array_equal(pa, pb), "the same for 1 and 4 workers"


def test_random_clips_change_with_the_seed_and_the_epoch():
    """The same seed and epoch give the same clips; another seed, or the next epoch, others."""
    source = random_source(8)

    def starts(seed, epoch=0):
        ld = loader(source, batch_size=4, loader_kw={"seed": seed}, frames=4, stride=2,
                    sampler="random")
        ld.set_epoch(epoch)
        return [numbers(v)[0] for b in ld for v in rows(b)]

    base = starts(1)
    assert base == starts(1)
    assert base != starts(2)
    assert base != starts(1, epoch=1)


# ---------------------------------------------------------------- 4. past the end: policies

SHORT = ("h264-mkv", 10)  # a 10-frame video


@pytest.mark.parametrize("sampler", ["random", "regular"])
@pytest.mark.parametrize("policy,want", [
    ("repeat_last", [0, 2, 4, 6, 8, 8, 8, 8]),
    ("wrap", [0, 2, 4, 6, 8, 0, 2, 4]),
])
def test_clip_past_the_end_is_completed_by_the_policy(policy, want, sampler):
    """8 frames at stride 2 (span 15) of a 10-frame video: the only start is 0, the indices
    0, 2, 4, 6, 8, completed by the policy (repeat_last: the last again; wrap: from the
    start), as torchcodec's samplers complete them."""
    data, ref = media(*SHORT), reference(*SHORT)
    assert len(ref.pts) == 10
    assert regular_indices(10, 8, 1, 2, policy) == [want]
    got, pts = one(data, frames=8, stride=2, sampler=sampler, policy=policy)
    assert numbers(got) == want
    assert_frames(got, ref.frames[want], policy)
    assert_pts(pts, ref.pts[want], policy)


def test_short_video_with_stride_1_repeats_its_last_frame():
    """16 frames of a 10-frame video, stride 1: frames 0..9 then 9 six more times."""
    got, _ = one(media(*SHORT), frames=16, sampler="random")
    assert numbers(got) == list(range(10)) + [9] * 6


def test_policy_error_is_a_data_error_naming_the_sample(tmp_path):
    """policy "error": a clip that runs past the end is a CorruptDataError naming the sample's
    key (skipped and counted with on_error="skip"); a video long enough is read."""
    url = shard(tmp_path, [{"__key__": "long", "mkv": media("h264-mkv")},
                           {"__key__": "short", "mkv": media(*SHORT)}])
    ops = {VIDEO_KEYS: {"as": "video", "ops": [video_op(frames=8, stride=2, policy="error")]}}
    with pytest.raises(chute.CorruptDataError, match="short"):
        list(chute.Loader(chute.webdataset([url]), batch_size=1, transforms=ops))
    ld = chute.Loader(chute.webdataset([url]), batch_size=1, transforms=ops, on_error="skip")
    got = list(ld)  # the bad sample replaced by the next in the order: as many batches
    assert [k for b in got for k in b["__key__"]] == ["long", "long"]
    assert ld.stats()["skipped"] == 1


# ---------------------------------------------------------------- 5. time-based sampling (fps)


def displayed(ref: Ref, times) -> List[int]:
    """The index of the frame displayed at each time: the largest pts <= t."""
    return (np.searchsorted(ref.pts, np.asarray(times), side="right") - 1).tolist()


def regular_times(ref: Ref, frames, clips, fps, policy="repeat_last") -> List[List[float]]:
    """The documented rule: starts begin + i * (range_end - begin) / clips, range_end =
    end - (frames - 1) / fps; times start + k / fps, those >= end dropped, then the policy."""
    step = 1.0 / fps
    range_end = min(ref.end - (frames - 1) * step, ref.end)
    assert range_end > ref.begin, "the clip fits in the video"
    out = []
    for i in range(clips):
        start = ref.begin + i * (range_end - ref.begin) / clips
        times = [t for t in (start + k * step for k in range(frames)) if t < ref.end]
        out.append(complete(times, frames, policy))
    return out


TIME_CASES = [  # (video, frames, clips, fps)
    ("vp9-webm", 4, 3, 7.0),  # 25 fps video, a frame every 1/7 s
    ("h264-mp4", 5, 3, 9.0),  # 29.97 fps (pts in 1/30000 s)
    ("h264-mkv", 10, 2, 60.0),  # faster than the video: frames repeat
]


@pytest.mark.parametrize("name,frames,clips,fps", TIME_CASES,
                         ids=[f"{c[0]}-{c[3]:g}fps" for c in TIME_CASES])
def test_fps_regular_clips_are_the_frames_displayed_at_their_times(name, frames, clips, fps):
    """fps=f, sampler "regular": clips starting at begin + i * range / clips, frames 1/f s apart;
    each the frame displayed at its time (largest pts <= t), as torchcodec's
    get_frames_played_at gives it; pts its pts."""
    data, ref = media(name), reference(name)
    times = regular_times(ref, frames, clips, fps)
    flat = [t for clip in times for t in clip]
    gap = min(np.abs(ref.pts - t).min() for t in flat if t != ref.begin)
    assert gap > 1e-6, "no time but the first falls on a frame boundary (the test is unambiguous)"
    want_idx = [displayed(ref, clip) for clip in times]
    played = vm.torchcodec_decoder(data).get_frames_played_at(seconds=flat)
    assert numbers(played.data.permute(0, 2, 3, 1).numpy()) == sum(want_idx, [])

    got, pts = one(data, frames=frames, clips=clips, fps=fps, sampler="regular")
    got, pts = (got, pts) if clips > 1 else (got[None], pts[None])
    assert got.shape[:2] == (clips, frames) and pts.shape == (clips, frames), got.shape
    assert [numbers(c) for c in got] == want_idx
    for k, idx in enumerate(want_idx):
        assert_frames(got[k], ref.frames[idx], f"{name} clip {k}")
        assert_pts(pts[k], ref.pts[idx], f"{name} clip {k}")


# ---------------------------------------------------------------- step: every clip that fits


def step_rule(n: int, frames: int, stride: int, step: int) -> List[List[int]]:
    """DALI's `step`, as the op documents it: clips start at 0, step, 2*step, ... while the clip
    fits (span stride * (frames - 1) + 1), at least one; a clip past the end is completed by
    the policy (repeat_last)."""
    span = stride * (frames - 1) + 1
    starts = range(0, max(n - span + 1, 1), step)
    return [complete(list(range(s, min(s + span, n), stride)), frames, "repeat_last")
            for s in starts]


@pytest.mark.parametrize("name,n_frames,frames,stride,step", [
    ("h264-mkv", None, 4, 2, 5),
    ("h264-mp4", None, 6, 1, 11),
    ("vp9-webm", None, 3, 3, 7),
    ("h264-mkv", 10, 16, 1, 3),  # shorter than a clip: one clip, completed
])
def test_step_takes_every_clip_that_fits(name, n_frames, frames, stride, step):
    """step=k frames (DALI's `step`): every clip that fits, starting k frames apart, as
    [clips, T, H, W, 3] (the clips axis even for one clip), frames and pts the reference's."""
    data, ref = media(name, n_frames), reference(name, n_frames)
    want = step_rule(len(ref.pts), frames, stride, step)
    got, pts = one(data, frames=frames, stride=stride, step=step)
    assert got.shape[:2] == (len(want), frames) and pts.shape == (len(want), frames), got.shape
    assert [numbers(c) for c in got] == want
    for k, idx in enumerate(want):
        assert_frames(got[k], ref.frames[idx], f"{name} clip {k}")
        assert_pts(pts[k], ref.pts[idx], f"{name} clip {k}")


@pytest.mark.parametrize("name,frames,fps,step", [
    ("h264-mkv", 4, 7.0, 0.73),
    ("vp9-webm", 3, 11.0, 0.37),
    ("h264-mkv-60fps", 5, 13.0, 0.07),
    ("h264-mp4", 2, 3.0, 0.61),
])
def test_step_seconds_equals_torchcodecs_regular_timestamps(name, frames, fps, step):
    """fps=f with step=s seconds: the clips of torchcodec's clips_at_regular_timestamps(
    seconds_between_clip_starts=s, num_frames_per_clip=frames, seconds_between_frames=1/f):
    the same number of clips, frames identical, pts equal."""
    from torchcodec.samplers import clips_at_regular_timestamps

    data, ref = media(name), reference(name)
    want = clips_at_regular_timestamps(vm.torchcodec_decoder(data), seconds_between_clip_starts=step,
                                       num_frames_per_clip=frames, seconds_between_frames=1 / fps)
    want_frames = want.data.permute(0, 1, 3, 4, 2).numpy()  # [clips, T, H, W, 3]
    got, pts = one(data, frames=frames, fps=fps, step=step)
    assert got.shape == want_frames.shape, (got.shape, want_frames.shape)
    assert want_frames.shape[0] >= 2, "several clips (the test means something)"
    for k in range(got.shape[0]):
        assert_frames(got[k], want_frames[k], f"{name} clip {k}")
    assert_pts(pts, want.pts_seconds.numpy().astype(np.float64), name)


def test_step_clips_of_varying_count_pad_into_one_batch():
    """Videos of 40 and 10 frames, a clip of 4 every 6 frames: 7 and 2 clips; pad=True gives
    [2, 7, T, H, W, 3] with a mask true over each sample's clips; without pad, a list."""
    long, short = media("h264-mkv"), media("h264-mkv", 10)
    source = [{"video": long}, {"video": short}]
    (b,) = list(loader(source, batch_size=2, loader_kw={"pad": True}, frames=4, step=6))
    video, mask = b["video"], b["video_mask"]
    assert video.shape == (2, 7, 4, 64, 96, 3), video.shape
    assert mask.shape == video.shape
    assert mask[0].all() and mask[1, :2].all() and not mask[1, 2:].any()
    assert not video[1, 2:].any()
    assert [numbers(c) for c in video[1, :2]] == step_rule(10, 4, 1, 6)
    (b,) = list(loader(source, batch_size=2, frames=4, step=6))
    assert [np.asarray(v).shape[0] for v in b["video"]] == [7, 2]


def test_fps_random_clips_are_valid_and_the_same_for_any_number_of_workers():
    """fps=10, 5 frames, random: for every clip some start s in [begin, end - 4/10) has each
    frame k the one displayed at s + k/10 (an interval per frame, intersected); the same for 1
    and 3 workers; the starts vary."""
    fps, frames = 10.0, 5
    source = random_source(8)
    runs = [clips_of(source, batch_size=4, loader_kw={"seed": 11, "num_workers": w},
                     frames=frames, fps=fps, sampler="random") for w in (1, 3)]
    firsts = set()
    for i, (v, p) in enumerate(zip(*runs[0])):
        ref = reference(RANDOM_VIDEOS[i % len(RANDOM_VIDEOS)])
        idx = numbers(v)
        assert_frames(v, ref.frames[idx], f"sample {i}")
        assert_pts(p, ref.pts[idx], f"sample {i}")
        lo, hi = ref.begin, ref.end - (frames - 1) / fps
        for k, j in enumerate(idx):
            shown_until = ref.pts[j + 1] if j + 1 < len(ref.pts) else ref.end
            lo, hi = max(lo, ref.pts[j] - k / fps), min(hi, shown_until - k / fps)
        assert lo < hi + 1e-9, f"sample {i}: no start gives frames {idx}"
        firsts.add((i % len(RANDOM_VIDEOS), idx[0]))
    assert len(firsts) > 4, firsts
    for a, b in zip(runs[0][0], runs[1][0]):
        assert np.array_equal(a, b)


# ---------------------------------------------------------------- 6. resize and crop


def torch_resize(frames: np.ndarray, size) -> np.ndarray:
    """uint8 [T, H, W, 3] resized to size (h, w): torch's bilinear interpolation with antialias
    (torchvision's Resize on tensors), rounded."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    y = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def shorter_side(h, w, size):
    """torchvision's Resize(int): the shorter side to size, the longer int(size * long / short)."""
    return (size, int(size * w / h)) if h <= w else (int(size * h / w), size)


def center(h, w, ch, cw):
    """torchvision's center_crop offsets: int(round((H - h) / 2)) (half to even)."""
    return int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))


INDICES = [0, 7, 20, 35]


@pytest.mark.parametrize("layout", ["THWC", "TCHW"])
def test_resize_shorter_side_then_center_crop_224(layout):
    """resize 256 (the shorter side) then crop 224, center, of a 320x240 video: [T, 224, 224, 3]
    (or [T, 3, 224, 224]) within RESIZE_TOLERANCE mean abs diff of torch's antialiased bilinear
    resize of torchcodec's frames to 341x256 and its center crop."""
    ref = reference("h264-mkv-60fps")
    got, pts = one(media("h264-mkv-60fps"), indices=INDICES, resize=256, crop=224, layout=layout)
    if layout == "TCHW":
        assert got.shape == (4, 3, 224, 224), got.shape
        got = np.moveaxis(got, 1, -1)
    assert got.shape == (4, 224, 224, 3), got.shape
    h, w = shorter_side(240, 320, 256)
    assert (h, w) == (256, 341)
    top, left = center(h, w, 224, 224)
    want = torch_resize(ref.frames[INDICES], (h, w))[:, top:top + 224, left:left + 224]
    diff = np.abs(got.astype(np.float64) - want).mean()
    assert diff < RESIZE_TOLERANCE, f"mean abs diff {diff}"
    assert_pts(pts, ref.pts[INDICES])


@pytest.mark.parametrize("name,resize,shape", [
    ("h264-mkv-60fps", [120, 200], (120, 200)),  # [h, w]: that size, aspect not kept
    ("h264-mp4", 100, (100, 177)),  # 160x90: shorter side 90 -> 100, 160 -> int(177.8)
    ("vp9-webm", 45, (45, 80)),  # downscale by 2
])
def test_resize_gives_torchvisions_size_and_close_pixels(name, resize, shape):
    """resize as an int (the shorter side, torchvision's rounding down of the longer) or [h, w]:
    that shape, within RESIZE_TOLERANCE of torch's antialiased bilinear resize."""
    ref = reference(name)
    idx = [1, 9, 17]
    got, _ = one(media(name), indices=idx, resize=resize)
    assert got.shape == (3, *shape, 3), got.shape
    diff = np.abs(got.astype(np.float64) - torch_resize(ref.frames[idx], shape)).mean()
    assert diff < RESIZE_TOLERANCE, f"mean abs diff {diff}"


@pytest.mark.parametrize("crop,size", [(48, (48, 48)), ([32, 64], (32, 64)), ([33, 47], (33, 47))],
                         ids=["48", "32x64", "33x47-odd-margins"])
def test_center_crop_at_native_size_is_exact(crop, size):
    """crop without resize, center: exactly the reference frames' window at torchvision's
    center_crop offsets (int(round(margin / 2)), half to even: 15.5 -> 16, 24.5 -> 24)."""
    ref = reference("h264-mkv")  # 96x64
    got, _ = one(media("h264-mkv"), indices=[2, 30], crop=crop)
    top, left = center(64, 96, *size)
    want = ref.frames[[2, 30], top:top + size[0], left:left + size[1]]
    assert_frames(got, want, f"crop {crop} at ({top}, {left})")


def crop_offset(frame: np.ndarray, crop: np.ndarray):
    """Every (top, left) where crop [h, w, 3] is frame [H, W, 3]'s window."""
    h, w = crop.shape[:2]
    return [(t, left) for t in range(frame.shape[0] - h + 1)
            for left in range(frame.shape[1] - w + 1)
            if np.array_equal(frame[t:t + h, left:left + w], crop)]


def test_random_crop_is_one_window_for_every_frame_of_a_clip():
    """crop_mode "random", 40x40 of a 96x64 video with moving content: each clip's frames are
    the reference frames' windows at one offset (the same for all its frames); the offsets
    vary between samples."""
    ref = reference("h264-mkv")
    idx = [0, 3, 6, 9, 12]
    videos, _ = clips_of([{"video": media("h264-mkv")}] * 8, batch_size=4, loader_kw={"seed": 3},
                         indices=idx, crop=40, crop_mode="random")
    offsets = set()
    for v in videos:
        assert v.shape == (5, 40, 40, 3), v.shape
        (at,) = crop_offset(ref.frames[idx[0]], v[0])
        for k in range(1, 5):
            assert crop_offset(ref.frames[idx[k]], v[k]) == [at], f"frame {k} cropped elsewhere"
        offsets.add(at)
    assert len(offsets) > 2, offsets


def test_random_resized_crop_is_one_box_for_every_frame_of_a_clip():
    """crop_mode "random_resized" (RandomResizedCrop: scale, ratio; output the crop size) of a
    video whose frames are all the same picture (MPEG-4 intra frames at a fixed quantizer:
    identical decoded frames): the frames of a clip come out identical (one box for the
    clip), the clips of different samples differ (boxes drawn per sample)."""
    data = vm.encode_video("mpeg4", "avi", 96, 64, 25, 12, gop=1,
                           frame_fn=lambda i, w, h: vm.pattern(0, w, h))
    frames, _ = vm.torchcodec_all(data)
    assert all(np.array_equal(frames[0], f) for f in frames), "the video's frames are identical"
    videos, _ = clips_of([{"video": data}] * 8, batch_size=4, loader_kw={"seed": 5}, frames=4,
                         crop=[40, 56], crop_mode="random_resized", scale=[0.2, 1.0])
    for v in videos:
        assert v.shape == (4, 40, 56, 3), v.shape
        assert all(np.array_equal(v[0], f) for f in v[1:]), "one box for the clip"
    distinct = {v[0].tobytes() for v in videos}
    assert len(distinct) > 3, "boxes differ between samples"


# ---------------------------------------------------------------- 7. sources

SOURCE_CASES = [("h264-mp4", "mp4"), ("h264-mkv", "mkv"), ("vp9-webm", "webm"),
                ("mpeg4-avi", "avi"), ("hevc-mkv", "mkv"), ("av1-webm", "webm")]
SOURCE_IDX = [0, 9, 4]


def check_sources(videos, pts, names):
    assert len(videos) == len(names)
    for name, v, p in zip(names, videos, pts):
        ref = reference(name)
        assert_frames(v, ref.frames[SOURCE_IDX], name)
        assert_pts(p, ref.pts[SOURCE_IDX], name)


def available_sources():
    return [(n, e) for n, e in SOURCE_CASES if vm.available(n)]


def test_webdataset_shard_of_mp4_mkv_webm_avi_members(tmp_path):
    """A WebDataset shard whose samples hold .mp4, .mkv, .webm or .avi (one transform for all the
    extensions, as "video") and a .cls label: each decoded as the reference decodes it, keys
    and labels in order; with pad=True one zero-padded [B, T, Hmax, Wmax, 3] and a mask true
    over each sample's frames."""
    cases = available_sources()
    samples = [{"__key__": f"v{i:03d}", ext: media(name), "cls": i}
               for i, (name, ext) in enumerate(cases)]
    url = shard(tmp_path, samples)
    ops = {"mp4;mkv;webm;avi": {"as": "video", "ops": [video_op(indices=SOURCE_IDX)]},
           "cls": [{"op": "label"}]}
    got = list(chute.Loader(chute.webdataset([url]), batch_size=3, transforms=ops, num_workers=2))
    assert [k for b in got for k in b["__key__"]] == [s["__key__"] for s in samples]
    assert [int(c) for b in got for c in b["cls"]] == list(range(len(cases)))
    check_sources([v for b in got for v in rows(b)], [p for b in got for p in rows(b, "video_pts")],
                  [n for n, _ in cases])

    (b,) = list(chute.Loader(chute.webdataset([url]), batch_size=len(cases), transforms=ops,
                             pad=True))
    hmax = max(vm.CASES[n].height for n, _ in cases)
    wmax = max(vm.CASES[n].width for n, _ in cases)
    video, mask = b["video"], b["video_mask"]
    assert video.shape == (len(cases), 3, hmax, wmax, 3), video.shape
    assert mask.shape == video.shape and mask.dtype == np.bool_
    for k, (name, _) in enumerate(cases):
        h, w = vm.CASES[name].height, vm.CASES[name].width
        assert np.array_equal(video[k, :, :h, :w], reference(name).frames[SOURCE_IDX]), name
        assert mask[k, :, :h, :w].all() and mask[k].sum() == 3 * h * w * 3, name
        assert not video[k][~mask[k]].any(), name


def test_webdataset_mpeg_ts_member(tmp_path):
    """A .ts member: the frames at the indices asked, by their numbers (torchcodec seeks wrongly
    in TS; the reference is PyAV's sequential decode)."""
    ref = reference("h264-ts")
    url = shard(tmp_path, [{"__key__": "t", "ts": media("h264-ts")}])
    ops = {VIDEO_KEYS: {"as": "video", "ops": [video_op(indices=[0, 30, 13, 35])]}}
    (b,) = list(chute.Loader(chute.webdataset([url]), batch_size=1, transforms=ops))
    v = np.asarray(b["video"])[0]
    assert numbers(v) == [0, 30, 13, 35]
    assert_frames(v, ref.frames[[0, 30, 13, 35]], "ts")


def test_parquet_binary_column(tmp_path):
    """Encoded videos in a Parquet file's binary column (pyarrow): decoded as the reference does."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet

    names = [n for n, _ in available_sources()]
    table = pa.table({"video": pa.array([media(n) for n in names], pa.binary()),
                      "label": list(range(len(names)))})
    path = tmp_path / "videos.parquet"
    pyarrow.parquet.write_table(table, path)
    ld = chute.Loader(chute.dataset(str(path)), batch_size=2,
                      transforms={"video": [video_op(indices=SOURCE_IDX)]})
    videos, pts, labels = [], [], []
    for b in ld:
        videos += rows(b)
        pts += rows(b, "video_pts")
        labels += [int(x) for x in b["label"]]
    assert labels == list(range(len(names)))
    check_sources(videos, pts, names)


def hf_video_dataset(encoded):
    """A datasets.Dataset whose "video" column is struct<bytes, path> (datasets' Video storage),
    cast to Video(decode=False) where this datasets has it, else built with pyarrow."""
    datasets = pytest.importorskip("datasets")
    column = [{"bytes": b, "path": None} for b in encoded]
    labels = list(range(len(encoded)))
    if hasattr(datasets, "Video"):
        ds = datasets.Dataset.from_dict({"video": column, "label": labels})
        return ds.cast_column("video", datasets.Video(decode=False))
    import pyarrow as pa

    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return datasets.Dataset(pa.table({"video": pa.array(column, struct), "label": labels}))


def test_hf_dataset_video_column_of_bytes():
    """A Hugging Face dataset whose Video(decode=False) column holds {"bytes", "path": None}:
    chute decodes the bytes as the reference does; the label column comes along."""
    names = [n for n, _ in available_sources()]
    ds = hf_video_dataset([media(n) for n in names])
    got = list(chute.Loader(ds, batch_size=2, transforms={"video": [video_op(indices=SOURCE_IDX)]}))
    assert [int(x) for b in got for x in b["label"]] == list(range(len(names)))
    check_sources([v for b in got for v in rows(b)], [p for b in got for p in rows(b, "video_pts")],
                  names)


def test_json_lines_manifest_of_paths(tmp_path):
    """A JSON Lines manifest of video file paths and labels: decode_video reads each file on the
    workers and decodes it as the reference does; a missing file is an error naming it."""
    cases = available_sources()
    rows_ = []
    for i, (name, ext) in enumerate(cases):
        path = tmp_path / f"clip{i}.{ext}"
        path.write_bytes(media(name))
        rows_.append({"path": str(path), "label": i})
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    ops = {"path": {"as": "video", "ops": [video_op(indices=SOURCE_IDX)]}}
    got = list(chute.Loader(chute.dataset(str(manifest)), batch_size=2, transforms=ops,
                            num_workers=2))
    check_sources([v for b in got for v in rows(b)], [p for b in got for p in rows(b, "video_pts")],
                  [n for n, _ in cases])
    rows_.append({"path": str(tmp_path / "missing.mp4"), "label": 99})
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    with pytest.raises(chute.CorruptDataError, match="missing.mp4"):
        list(chute.Loader(chute.dataset(str(manifest)), batch_size=2, transforms=ops))


# ---------------------------------------------------------------- 8. bad and hostile data


def hostile_vp9(width: int, height: int) -> bytes:
    """A WebM VP9 video (8 frames, one keyframe) encoded at 256x256 whose container
    (PixelWidth/PixelHeight) and keyframe header (frame_width_minus_1/frame_height_minus_1,
    profile 0) both claim width x height; the frame data stays that of 256x256."""
    data = bytearray(vm.encode_video("libvpx-vp9", "webm", 256, 256, 25, 8, gop=100))
    at = data.find(b"\x49\x83\x42")  # the keyframe's sync code, after its first byte
    assert at > 0 and data[at - 1] == 0x82, "a profile 0 shown keyframe"
    # After the sync code: color_space (3 bits), color_range (1), width - 1 (16), height - 1 (16).
    bits = int.from_bytes(data[at + 3:at + 8], "big")
    bits = (bits & ~(((1 << 32) - 1) << 4)) | ((width - 1) << 20) | ((height - 1) << 4)
    data[at + 3:at + 8] = bits.to_bytes(5, "big")
    for element, value in ((b"\xb0", width), (b"\xba", height)):  # 2-byte uints holding 256
        tag = element + b"\x82\x01\x00"
        assert data.count(tag) == 1, tag
        j = data.find(tag)
        data[j + 2:j + 4] = value.to_bytes(2, "big")
    return bytes(data)


def test_max_pixels_and_max_frames_refuse_a_video_by_key(tmp_path):
    """decode_video's max_pixels (a frame's declared width x height) and max_frames (frames in
    the stream): a video over either is a CorruptDataError of kind "too_large" naming the key
    and the limit (skipped and counted with on_error="skip"); at the limit it is read."""
    url = shard(tmp_path, [{"__key__": "small", "mkv": media("h264-mkv")},  # 96x64, 40 frames
                           {"__key__": "big", "mp4": media("h264-mp4")}])  # 160x90, 48 frames

    def run(on_error="raise", **limit):
        ops = {VIDEO_KEYS: {"as": "video", "ops": [video_op(frames=4, **limit)]}}
        ld = chute.Loader(chute.webdataset([url]), batch_size=1, transforms=ops,
                          on_error=on_error)
        return list(ld), ld

    for limit, says in (({"max_pixels": 160 * 90 - 1}, "max_pixels"),
                        ({"max_frames": 47}, "max_frames")):
        with pytest.raises(chute.CorruptDataError, match="big") as e:
            run(**limit)
        assert says in str(e.value) and e.value.kind == "too_large", (str(e.value), e.value.kind)
        got, ld = run("skip", **limit)
        assert len(got) == 2 and ld.stats()["skipped"] == 1
    assert len(run(max_pixels=160 * 90, max_frames=48)[0]) == 2


def test_index_past_the_end_is_an_error_naming_the_sample(tmp_path):
    """indices naming a frame the video lacks (40 of a 40-frame video): an error naming the
    sample's key and the index (indices take no policy)."""
    url = shard(tmp_path, [{"__key__": "forty", "mkv": media("h264-mkv")}])
    ops = {VIDEO_KEYS: {"as": "video", "ops": [video_op(indices=[0, 39, 40])]}}
    with pytest.raises((chute.CorruptDataError, chute.ConfigError), match="forty") as e:
        list(chute.Loader(chute.webdataset([url]), batch_size=1, transforms=ops))
    assert "40" in str(e.value), str(e.value)


def truncated(name, fraction=0.5):
    data = media(name)
    return data[: int(len(data) * fraction)]


BAD = {  # key: (extension, a function making the bytes)
    "garbage": ("mp4", lambda: bytes(np.random.default_rng(0).integers(0, 256, 20000, np.uint8))),
    "cut-mp4": ("mp4", lambda: truncated("h264-mp4")),  # PyAV writes moov at the end: none left
    "cut-mkv-header": ("mkv", lambda: truncated("h264-mkv", 0.01)),
    "empty": ("webm", lambda: b""),
    "text": ("avi", lambda: b"RIFF but not really an AVI file" * 10),
}
BAD_OPS = {VIDEO_KEYS: {"as": "video", "ops": [video_op(frames=4)]}, "cls": [{"op": "label"}]}


@pytest.mark.parametrize("key", list(BAD))
def test_bad_video_raises_naming_its_key(tmp_path, key):
    """Random bytes, an MP4 cut in half (no moov), an MKV cut inside its header, an empty
    member, text: a CorruptDataError naming the sample's key."""
    ext, make = BAD[key]
    url = shard(tmp_path, [{"__key__": "fine", "mkv": media("h264-mkv"), "cls": 0},
                           {"__key__": key, ext: make(), "cls": 1}])
    with pytest.raises(chute.CorruptDataError, match=key):
        list(chute.Loader(chute.webdataset([url]), batch_size=1, transforms=BAD_OPS))


def test_bad_video_is_skipped_and_counted(tmp_path):
    """The same bad samples among good ones with on_error="skip": every batch full, each bad
    sample counted once."""
    samples = [{"__key__": f"good{i}", "mkv": media("h264-mkv"), "cls": i}
               for i in range(16 - len(BAD))]  # 16 in all: four full batches
    for j, (key, (ext, make)) in enumerate(BAD.items()):
        samples.insert(2 * j + 1, {"__key__": key, ext: make(), "cls": 100})
    url = shard(tmp_path, samples)
    ld = chute.Loader(chute.webdataset([url]), batch_size=4, transforms=BAD_OPS, on_error="skip",
                      num_workers=2)
    got = list(ld)
    assert [len(b["cls"]) for b in got] == [4, 4, 4, 4], "the batches stay full"
    assert all(int(c) < 100 for b in got for c in b["cls"]), "no bad sample comes through"
    assert ld.stats()["skipped"] == len(BAD)


HOSTILE = """
    import resource, sys, chute
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000_000, 2_000_000_000))
    url, mode = sys.argv[1], sys.argv[2]
    ops = {"webm;mkv": {"as": "video", "ops": [{"op": "decode_video", "frames": 16}]}}
    try:
        loader = chute.Loader(chute.webdataset([url]), batch_size=1, on_error=mode,
                              transforms=ops)
        n = sum(1 for _ in loader)
        print("read", n, "skipped", loader.stats()["skipped"], flush=True)
    except BaseException as e:
        print("error", type(e).__name__, str(e).replace("\\n", " "), flush=True)
"""


@pytest.mark.parametrize("width,height", [(16000, 16000), (65535, 65535)])
def test_huge_frame_size_claims_are_refused_under_a_2gb_address_space(tmp_path, width, height):
    """A VP9 WebM whose container and keyframe claim 16000x16000 (an RGB frame of 768 MB, a
    16-frame clip 12 GB; within FFmpeg's own size check) or 65535x65535 (beyond it), decoded in
    a fresh process limited to 2 GB of address space: skipped as corrupt with
    on_error="skip", a CorruptDataError naming the key otherwise (16000x16000 is over
    max_pixels' default, chute's max_image_pixels of 178,956,970: the message says so); no
    MemoryError, no abort. (The frame data is that of 256x256: FFmpeg's decoder would fail on
    it too; test_max_pixels_and_max_frames_refuse_a_video_by_key checks the limit on a valid
    video.)"""
    key = f"huge-{width}x{height}"
    url = shard(tmp_path, [{"__key__": "fine", "mkv": media("h264-mkv")},
                           {"__key__": key, "webm": hostile_vp9(width, height)}])
    out = run_python(HOSTILE, url, "skip", timeout=120)
    # The bad sample is replaced by the next one in the order: two batches, one skip.
    assert out.stdout.strip() == "read 2 skipped 1", f"{out.stdout}\n{out.stderr[-2000:]}"
    out = run_python(HOSTILE, url, "raise", timeout=120)
    line = out.stdout.strip()
    assert line.startswith("error CorruptDataError") and key in line, (
        f"{line}\n{out.stderr[-2000:]}")
    if width * height > 178_956_970:  # chute's default max_image_pixels, max_pixels' default
        assert "max_pixels" in line, line
    assert "MemoryError" not in out.stderr and "memory allocation" not in out.stderr


# ---------------------------------------------------------------- 9. bad op specs


@pytest.mark.parametrize("params,says", [
    ({"frames": 0}, "frames"),
    ({"clips": 0}, "clips"),
    ({"stride": 0}, "stride"),
    ({"fps": 0}, "fps"),
    ({"fps": -5}, "fps"),
    ({"sampler": "uniform"}, "uniform"),  # serde's unknown variant: the value, not the key
    ({"policy": "clamp"}, "clamp"),
    ({"layout": "HWC"}, "HWC"),
    ({"crop_mode": "corner"}, "corner"),
    ({"indices": []}, "indices"),
    ({"indices": [-1]}, "-1"),
    ({"resize": 0}, "resize"),
    ({"resize": [100000, 100000]}, "resize"),
    ({"crop": [0, 10]}, "crop"),
    ({"max_frames": 0}, "max_frames"),
    ({"crop": 10, "crop_mode": "random_resized", "scale": [0.9, 0.1]}, "scale"),
    ({"crop": 10, "crop_mode": "random_resized", "ratio": [0, 1]}, "ratio"),
    ({"frame": 16}, "frame"),  # an unknown key (a typo of frames)
    ({"step": 0}, "step 0"),
    ({"step": 2.5}, "whole number"),  # frames, without fps
    ({"step": 0, "fps": 5}, "seconds between clip starts"),
    ({"step": 3, "clips": 2}, "clips 2 with step"),
    ({"step": 3, "indices": [1]}, "step with indices"),
], ids=lambda p: json.dumps(p) if isinstance(p, dict) else None)
def test_bad_video_op_specs_are_config_errors(params, says):
    """Impossible decode_video specs: a ConfigError naming the field and what is wrong, before any
    data is read."""
    with pytest.raises(chute.ConfigError, match=says) as e:
        chute.Loader([{"a": b"never read"}], batch_size=1, transforms={"a": [video_op(**params)]})
    assert 'field "a"' in str(e.value), str(e.value)
