//! Which frames a clip takes: the rules of torchcodec's samplers (`clips_at_random_indices`,
//! `clips_at_regular_indices`, and the timestamp samplers), with the random choices drawn from
//! the sample's RNG. Pure arithmetic on the stream's frame table: no decoding here.

use chute_core::SampleRng;

/// Where clips start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    /// Uniformly at random in the range a clip may start in (the sample's RNG).
    Random,
    /// Evenly spaced over that range (`torch.linspace` of the start indices, or of the
    /// start times), the first at the first frame.
    Regular,
    /// Every clip that fits, starting this far apart from the first frame: frames with
    /// [`Spacing::Frames`] (DALI's `step`), seconds with [`Spacing::Fps`] (torchcodec's
    /// `clips_at_regular_timestamps` and its `seconds_between_clip_starts`). The number of
    /// clips is the video's: at least one (a video shorter than a clip gives one, completed by
    /// the policy).
    Every(f64),
}

/// What a clip does past the end of the video.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Repeat the clip's last frame.
    RepeatLast,
    /// Start the clip's frames over (`[1, 2, 3]` to five frames: `[1, 2, 3, 1, 2]`).
    Wrap,
    /// A data error.
    Error,
}

/// How a clip's frames are spaced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spacing {
    /// Every `stride`-th frame (torchcodec's `num_indices_between_frames`).
    Frames(usize),
    /// Frames at this rate: the frame shown at each `1 / fps` seconds (torchcodec's
    /// `seconds_between_frames`).
    Fps(f64),
}

/// A sampling request: `clips` clips of `frames` frames.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Frames per clip.
    pub frames: usize,
    /// Clips per video.
    pub clips: usize,
    /// How the frames of a clip are spaced.
    pub spacing: Spacing,
    /// Where clips start.
    pub sampler: Sampler,
    /// Past the end of the video.
    pub policy: Policy,
}

/// The frames of a stream, in presentation order: each one's time in seconds (sorted) and
/// the time the stream ends (the last frame's time plus its duration).
#[derive(Debug, Clone, PartialEq)]
pub struct FrameTable {
    /// Presentation times, seconds, ascending.
    pub pts: Vec<f64>,
    /// The end of the last frame, seconds.
    pub end: f64,
}

/// torchcodec's `torch.linspace(start, end, steps, dtype=int)`: float steps computed from
/// both ends (as torch computes them), truncated toward zero.
fn linspace_int(start: f64, end: f64, steps: usize) -> Vec<usize> {
    if steps == 1 {
        return vec![start as usize];
    }
    let step = (end - start) / (steps - 1) as f64;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            let v = if i < half {
                start + step * i as f64
            } else {
                end - step * (steps - 1 - i) as f64
            };
            v.max(0.0) as usize
        })
        .collect()
}

/// Completes `values` to `n` by the policy (`values` is not empty).
fn complete<T: Copy>(mut values: Vec<T>, n: usize, policy: Policy) -> Result<Vec<T>, String> {
    if values.len() >= n {
        values.truncate(n);
        return Ok(values);
    }
    match policy {
        Policy::RepeatLast => {
            let last = *values.last().expect("a clip has a first frame");
            values.resize(n, last);
            Ok(values)
        }
        Policy::Wrap => {
            let k = values.len();
            Ok((0..n).map(|i| values[i % k]).collect())
        }
        Policy::Error => Err(format!(
            "a clip runs past the end of the video ({} of its {n} frames exist) and the policy \
             is \"error\"; use \"repeat_last\" or \"wrap\", or fewer frames or a smaller stride",
            values.len()
        )),
    }
}

/// The frame shown at time `t`: the last one whose time is at most `t` (the first frame for
/// a time before it).
fn frame_at(pts: &[f64], t: f64) -> usize {
    pts.partition_point(|&p| p <= t).saturating_sub(1)
}

/// Most clips a `step` may give one video (as many as `clips` may ask for).
pub const MAX_STEP_CLIPS: usize = 10_000;

/// Refuses a `step` that gives more than [`MAX_STEP_CLIPS`] clips (before their frames are
/// listed).
fn check_clip_count(count: usize) -> Result<(), String> {
    if count > MAX_STEP_CLIPS {
        return Err(format!(
            "the step gives {count} clips of this video, more than {MAX_STEP_CLIPS}: use a \
             larger step"
        ));
    }
    Ok(())
}

/// The frame indices of every clip, clip by clip (`clips * frames` of them), by torchcodec's
/// rules: see the module docs of [`crate::video`].
pub fn clip_indices(
    s: &Sampling,
    table: &FrameTable,
    rng: &mut SampleRng,
) -> Result<Vec<usize>, String> {
    let n = table.pts.len();
    if n == 0 {
        return Err("the video stream has no frames".into());
    }
    let mut out = Vec::with_capacity(s.clips.min(n) * s.frames);
    match s.spacing {
        Spacing::Frames(stride) => {
            let span = stride * (s.frames - 1) + 1;
            // Clips start in [0, end): the last start whose clip fits, at least one.
            let end = (n + 1).saturating_sub(span).max(1);
            let starts: Vec<usize> = match s.sampler {
                Sampler::Random => (0..s.clips)
                    .map(|_| rng.below(end as u64) as usize)
                    .collect(),
                Sampler::Regular => linspace_int(0.0, (end - 1) as f64, s.clips),
                Sampler::Every(step) => {
                    let step = (step as usize).max(1);
                    check_clip_count(end.div_ceil(step))?;
                    (0..end).step_by(step).collect()
                }
            };
            for start in starts {
                let idx: Vec<usize> = (start..(start + span).min(n)).step_by(stride).collect();
                out.extend(complete(idx, s.frames, s.policy)?);
            }
        }
        Spacing::Fps(fps) => {
            let between = 1.0 / fps;
            let (begin, stop) = (table.pts[0], table.end);
            // Clips start in [begin, end): late enough starts would need the policy.
            let end = (stop - (s.frames - 1) as f64 * between).min(stop);
            let width = (end - begin).max(0.0);
            let starts: Vec<f64> = match s.sampler {
                Sampler::Random => (0..s.clips)
                    .map(|_| begin + rng.next_f64() * width)
                    .collect(),
                Sampler::Regular => (0..s.clips)
                    .map(|i| begin + width * i as f64 / s.clips as f64)
                    .collect(),
                // torch.arange(begin, end, step) in float64, kept below `end`.
                Sampler::Every(step) => {
                    let count = if width > 0.0 {
                        let count = (width / step).ceil();
                        check_clip_count(if count < 1e12 {
                            count as usize
                        } else {
                            usize::MAX
                        })?;
                        (count as usize).max(1)
                    } else {
                        1
                    };
                    // Never empty: the first start, `begin`, is below `end` (or the only one).
                    (0..count)
                        .map(|i| begin + i as f64 * step)
                        .filter(|&t| t < end || width <= 0.0)
                        .collect()
                }
            };
            for start in starts {
                let times: Vec<f64> = (0..s.frames)
                    .map(|i| start + i as f64 * between)
                    .filter(|&t| t < stop)
                    .collect();
                let times = if times.is_empty() { vec![start] } else { times };
                let times = complete(times, s.frames, s.policy)?;
                out.extend(times.into_iter().map(|t| frame_at(&table.pts, t)));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: usize, fps: f64) -> FrameTable {
        FrameTable {
            pts: (0..n).map(|i| i as f64 / fps).collect(),
            end: n as f64 / fps,
        }
    }

    fn sampling(frames: usize, clips: usize, spacing: Spacing, sampler: Sampler) -> Sampling {
        Sampling {
            frames,
            clips,
            spacing,
            sampler,
            policy: Policy::RepeatLast,
        }
    }

    #[test]
    fn linspace_truncates_as_torch_does() {
        assert_eq!(
            linspace_int(0.0, 10.0, 20),
            [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 10]
        );
        assert_eq!(linspace_int(0.0, 90.0, 4), [0, 30, 60, 90]);
        assert_eq!(linspace_int(3.0, 3.0, 1), [3]);
    }

    #[test]
    fn regular_index_clips_cover_the_video() {
        let t = table(100, 25.0);
        let s = sampling(4, 3, Spacing::Frames(2), Sampler::Regular);
        let mut rng = SampleRng::for_sample(0, 0, 0);
        // span 7: starts in [0, 94), linspace(0, 93, 3) = 0, 46, 93.
        let idx = clip_indices(&s, &t, &mut rng).unwrap();
        assert_eq!(
            idx,
            [0, 2, 4, 6, 46, 48, 50, 52, 93, 95, 97, 99],
            "regular starts, stride 2"
        );
    }

    #[test]
    fn random_clips_fit_and_follow_the_rng() {
        let t = table(50, 30.0);
        let s = sampling(8, 5, Spacing::Frames(3), Sampler::Random);
        let a = clip_indices(&s, &t, &mut SampleRng::for_sample(7, 0, 3)).unwrap();
        let b = clip_indices(&s, &t, &mut SampleRng::for_sample(7, 0, 3)).unwrap();
        assert_eq!(a, b);
        for clip in a.chunks(8) {
            assert!(clip.windows(2).all(|w| w[1] == w[0] + 3), "{clip:?}");
            assert!(*clip.last().unwrap() < 50);
        }
        let c = clip_indices(&s, &t, &mut SampleRng::for_sample(7, 1, 3)).unwrap();
        assert_ne!(a, c, "another epoch draws other clips");
    }

    #[test]
    fn policies_past_the_end() {
        let t = table(5, 10.0);
        let mut rng = SampleRng::for_sample(0, 0, 0);
        let mut s = sampling(4, 1, Spacing::Frames(2), Sampler::Regular);
        assert_eq!(clip_indices(&s, &t, &mut rng).unwrap(), [0, 2, 4, 4]);
        s.policy = Policy::Wrap;
        assert_eq!(clip_indices(&s, &t, &mut rng).unwrap(), [0, 2, 4, 0]);
        s.policy = Policy::Error;
        let e = clip_indices(&s, &t, &mut rng).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
    }

    #[test]
    fn every_clip_that_fits_at_a_step() {
        // DALI's step: 20 frames, clips of 4 frames at stride 2 (span 7) every 5 frames:
        // starts 0, 5, 10 (15 would run past the end).
        let t = table(20, 25.0);
        let s = sampling(4, 1, Spacing::Frames(2), Sampler::Every(5.0));
        let idx = clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).unwrap();
        assert_eq!(idx, [0, 2, 4, 6, 5, 7, 9, 11, 10, 12, 14, 16]);
        // A video shorter than a clip: one clip, completed by the policy.
        let t = table(3, 25.0);
        let idx = clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).unwrap();
        assert_eq!(idx, [0, 2, 2, 2]);
        // In time (torchcodec's clips_at_regular_timestamps): 3 s at 10 fps, 2 frames 0.5 s
        // apart, a clip every 1.2 s: starts in [0, 2.5): 0, 1.2, 2.4.
        let t = table(30, 10.0);
        let s = sampling(2, 1, Spacing::Fps(2.0), Sampler::Every(1.2));
        let idx = clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).unwrap();
        assert_eq!(idx, [0, 5, 12, 17, 24, 29]);
        // A step that would list more clips than allowed is refused before any is made.
        let s = sampling(2, 1, Spacing::Fps(2.0), Sampler::Every(1e-9));
        let e = clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).unwrap_err();
        assert!(e.contains("larger step"), "{e}");
        let t = table(20_005, 25.0);
        let s = sampling(1, 1, Spacing::Frames(1), Sampler::Every(2.0));
        assert!(clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).is_err());
    }

    #[test]
    fn fps_spacing_takes_the_frame_shown_at_each_time() {
        // 30 fps video sampled at 10 fps: every third frame.
        let t = table(90, 30.0);
        let s = sampling(4, 1, Spacing::Fps(10.0), Sampler::Regular);
        let idx = clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).unwrap();
        assert_eq!(idx, [0, 3, 6, 9]);
        // Two clips at regular start times over [0, 3 - 0.3).
        let s = sampling(2, 2, Spacing::Fps(10.0), Sampler::Regular);
        let idx = clip_indices(&s, &t, &mut SampleRng::for_sample(0, 0, 0)).unwrap();
        assert_eq!(idx, [0, 3, 43, 46]);
        assert_eq!(frame_at(&t.pts, -1.0), 0);
        assert_eq!(frame_at(&t.pts, 100.0), 89);
    }
}
