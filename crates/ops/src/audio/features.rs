//! The features speech models train on, computed as their reference implementations compute
//! them:
//!
//! - [`log_mel`]: Whisper's log-mel spectrogram, as `openai-whisper`'s `log_mel_spectrogram`
//!   after `pad_or_trim` (and `transformers`' `WhisperFeatureExtractor`): 16 kHz audio padded
//!   with zeros or cut to `n_samples` (480,000: 30 s), a 400-point STFT every 160 samples with
//!   a periodic Hann window and centred reflect padding, the last frame dropped, the power
//!   spectrum through Slaney-style mel filters (librosa's `filters.mel`, 80 or 128 bins),
//!   `log10` of it clamped at 1e-10, floored at its maximum - 8, then `(x + 4) / 4`.
//!   `float32 [n_mels, frames]`.
//! - [`fbank`]: Kaldi's filter-bank features as `torchaudio.compliance.kaldi.fbank` computes
//!   them ([`FbankOptions`]: its defaults, its parameter names). `float32 [frames, bins]`.
//! - [`spec_augment`]: SpecAugment's frequency and time masks (torchaudio's
//!   `FrequencyMasking` / `TimeMasking` draws), from the sample's RNG.

use std::sync::{Arc, Mutex, OnceLock};

use chute_core::SampleRng;
use realfft::RealFftPlanner;

pub use crate::spec::FbankOptions;
use realfft::num_complex::Complex32;

/// Whisper's FFT size.
pub const WHISPER_N_FFT: usize = 400;
/// Whisper's hop.
pub const WHISPER_HOP: usize = 160;
/// Whisper's rate.
pub const WHISPER_RATE: u32 = 16_000;

/// A filter bank: for each bin, its first FFT bin and weights (the rest are zero).
#[derive(Debug)]
struct Bank {
    rows: Vec<(usize, Vec<f32>)>,
}

impl Bank {
    fn from_dense(dense: &[Vec<f64>]) -> Bank {
        let rows = dense
            .iter()
            .map(|row| {
                let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let last = row.iter().rposition(|&w| w != 0.0).map_or(first, |i| i + 1);
                (first, row[first..last].iter().map(|&w| w as f32).collect())
            })
            .collect();
        Bank { rows }
    }

    /// Bin `b`'s energy for a power spectrum.
    #[inline]
    fn apply(&self, b: usize, power: &[f32]) -> f32 {
        let (first, w) = &self.rows[b];
        w.iter().zip(&power[*first..]).map(|(w, p)| w * p).sum()
    }
}

fn hz_to_mel_slaney(f: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz_slaney(m: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// librosa's `filters.mel(sr, n_fft, n_mels)` (Slaney scale and norm, 0 Hz to `sr / 2`).
fn slaney_bank(rate: u32, n_fft: usize, n_mels: usize) -> Bank {
    let sr = f64::from(rate);
    let bins = n_fft / 2 + 1;
    let fft: Vec<f64> = (0..bins).map(|i| i as f64 * sr / n_fft as f64).collect();
    let (lo, hi) = (hz_to_mel_slaney(0.0), hz_to_mel_slaney(sr / 2.0));
    let mel_f: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz_slaney(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let dense: Vec<Vec<f64>> = (0..n_mels)
        .map(|i| {
            let (d0, d1) = (mel_f[i + 1] - mel_f[i], mel_f[i + 2] - mel_f[i + 1]);
            let enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
            fft.iter()
                .map(|&f| {
                    let lower = (f - mel_f[i]) / d0;
                    let upper = (mel_f[i + 2] - f) / d1;
                    // librosa keeps float32 weights, then scales them.
                    f64::from((lower.min(upper).max(0.0)) as f32) * enorm
                })
                .collect()
        })
        .collect();
    Bank::from_dense(&dense)
}

/// The process's FFT planner (plans are made once per size, shared by the threads).
pub(super) fn planner() -> &'static Mutex<RealFftPlanner<f32>> {
    static PLANNER: OnceLock<Mutex<RealFftPlanner<f32>>> = OnceLock::new();
    PLANNER.get_or_init(Default::default)
}

/// A forward real FFT of size `n`.
fn fft(n: usize) -> Arc<dyn realfft::RealToComplex<f32>> {
    planner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .plan_fft_forward(n)
}

/// Whisper's filter banks made so far, by their number of bins.
type Banks = Mutex<Vec<(usize, Arc<Bank>)>>;

fn whisper_bank(n_mels: usize) -> Arc<Bank> {
    static BANKS: OnceLock<Banks> = OnceLock::new();
    let banks = BANKS.get_or_init(Default::default);
    let mut banks = banks.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = banks.iter().find(|(n, _)| *n == n_mels) {
        return b.clone();
    }
    let b = Arc::new(slaney_bank(WHISPER_RATE, WHISPER_N_FFT, n_mels));
    banks.push((n_mels, b.clone()));
    b
}

/// Index `i` of `x` extended by reflection at both ends (numpy's and torch's `reflect`,
/// repeated for signals shorter than the padding).
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let mut j = i.rem_euclid(period);
    if j >= n as isize {
        j = period - j;
    }
    j as usize
}

/// Whisper's log-mel spectrogram of 16 kHz mono `samples` (see the module docs): with
/// `n_samples`, the audio padded or cut to that many samples first (Whisper's 30 s:
/// 480,000, giving 3,000 frames); `None` keeps its length (`len / 160` frames). Gives
/// `[n_mels, frames]`, row by row.
pub fn log_mel(samples: &[f32], n_mels: usize, n_samples: Option<usize>) -> (Vec<f32>, usize) {
    let len = n_samples.unwrap_or(samples.len());
    let audio = |i: usize| samples.get(i).copied().unwrap_or(0.0);
    let (n_fft, hop) = (WHISPER_N_FFT, WHISPER_HOP);
    let pad = n_fft / 2;
    // torch.stft with center=True has 1 + len / hop frames; Whisper drops the last.
    let frames = len / hop;
    let window: Vec<f32> = (0..n_fft)
        .map(|n| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / n_fft as f64).cos()) as f32)
        .collect();
    let bank = whisper_bank(n_mels);
    let plan = fft(n_fft);
    let mut input = plan.make_input_vec();
    let mut spectrum = plan.make_output_vec();
    let mut scratch = plan.make_scratch_vec();
    let mut power = vec![0f32; spectrum.len()];
    let mut out = vec![0f32; n_mels * frames];
    let mut max = f32::NEG_INFINITY;
    // Frames wholly in the zero padding after the audio (most of them, for a short clip padded
    // to 30 s) are silence: every bin is log10(1e-10) before the floor, no transform needed.
    let silence = 1e-10f32.log10();
    let zeros_after = len > samples.len() + pad;
    for t in 0..frames {
        let start = (t * hop) as isize - pad as isize;
        if zeros_after && start >= samples.len() as isize {
            for b in 0..n_mels {
                out[b * frames + t] = silence;
            }
            max = max.max(silence);
            continue;
        }
        for (k, x) in input.iter_mut().enumerate() {
            let i = start + k as isize;
            let v = if i >= 0 && (i as usize) < len {
                audio(i as usize)
            } else if len > 0 {
                audio(reflect(i, len))
            } else {
                0.0
            };
            *x = v * window[k];
        }
        plan.process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .expect("buffers made by the plan");
        for (p, c) in power.iter_mut().zip(&spectrum) {
            *p = c.norm_sqr();
        }
        for b in 0..n_mels {
            let v = bank.apply(b, &power).max(1e-10).log10();
            max = max.max(v);
            out[b * frames + t] = v;
        }
    }
    let floor = max - 8.0;
    for v in &mut out {
        *v = (v.max(floor) + 4.0) / 4.0;
    }
    (out, frames)
}

/// float32's machine epsilon, torchaudio's floor under logs.
const EPSILON: f32 = f32::EPSILON;

fn kaldi_mel(f: f64) -> f64 {
    1127.0 * (1.0 + f / 700.0).ln()
}

/// `FbankOptions`' checks and the parts it is made of (the options are declared with the
/// ops, in [`crate::spec`]).
impl FbankOptions {
    /// Checks what does not depend on the audio: the window type and the number of bins.
    pub fn check_static(&self) -> Result<(), String> {
        if !matches!(
            self.window_type.as_str(),
            "povey" | "hanning" | "hamming" | "rectangular" | "blackman"
        ) {
            return Err(format!(
                "window_type {:?}: povey, hanning, hamming, rectangular or blackman",
                self.window_type
            ));
        }
        if self.num_mel_bins < 3 || self.num_mel_bins > 1024 {
            return Err(format!("num_mel_bins {}: 3 to 1024", self.num_mel_bins));
        }
        if !(self.frame_length > 0.0 && self.frame_shift > 0.0 && self.scale.is_finite()) {
            return Err("frame_length and frame_shift must be positive, scale finite".into());
        }
        Ok(())
    }

    /// Checks the options for audio at `rate`: the window type, sizes and the mel range.
    pub fn check(&self, rate: u32) -> Result<(usize, usize, usize), String> {
        self.check_static()?;
        let sr = f64::from(rate);
        let shift = (sr * self.frame_shift * 0.001) as usize;
        let size = (sr * self.frame_length * 0.001) as usize;
        if size < 2 || shift < 1 {
            return Err(format!(
                "frame_length {} ms and frame_shift {} ms are under two samples or one at {rate} Hz",
                self.frame_length, self.frame_shift
            ));
        }
        if size > 1 << 20 {
            return Err(format!("frame_length {} ms is too long", self.frame_length));
        }
        let padded = if self.round_to_power_of_two {
            size.next_power_of_two()
        } else {
            size
        };
        let nyquist = sr / 2.0;
        let high = if self.high_freq <= 0.0 {
            self.high_freq + nyquist
        } else {
            self.high_freq
        };
        if !(0.0 <= self.low_freq
            && self.low_freq < nyquist
            && 0.0 < high
            && high <= nyquist
            && self.low_freq < high)
        {
            return Err(format!(
                "low_freq {} and high_freq {} do not fit 0 <= low < high <= {nyquist} (Nyquist at {rate} Hz)",
                self.low_freq, self.high_freq
            ));
        }
        Ok((size, shift, padded))
    }

    fn window(&self, size: usize) -> Vec<f64> {
        let a = 2.0 * std::f64::consts::PI / (size - 1) as f64;
        (0..size)
            .map(|i| {
                let i = i as f64;
                match self.window_type.as_str() {
                    "hanning" => 0.5 - 0.5 * (a * i).cos(),
                    "hamming" => 0.54 - 0.46 * (a * i).cos(),
                    "povey" => (0.5 - 0.5 * (a * i).cos()).powf(0.85),
                    "blackman" => {
                        self.blackman_coeff - 0.5 * (a * i).cos()
                            + (0.5 - self.blackman_coeff) * (2.0 * a * i).cos()
                    }
                    _ => 1.0,
                }
            })
            .collect()
    }

    fn bank(&self, rate: u32, padded: usize) -> Bank {
        let sr = f64::from(rate);
        let nyquist = sr / 2.0;
        let high = if self.high_freq <= 0.0 {
            self.high_freq + nyquist
        } else {
            self.high_freq
        };
        let bins = padded / 2;
        let width = sr / padded as f64;
        let (lo, hi) = (kaldi_mel(self.low_freq), kaldi_mel(high));
        let delta = (hi - lo) / (self.num_mel_bins + 1) as f64;
        let dense: Vec<Vec<f64>> = (0..self.num_mel_bins)
            .map(|b| {
                let left = lo + b as f64 * delta;
                let center = lo + (b + 1) as f64 * delta;
                let right = lo + (b + 2) as f64 * delta;
                // The bank has a zero column for the Nyquist bin, as torchaudio pads it.
                (0..=bins)
                    .map(|i| {
                        if i == bins {
                            return 0.0;
                        }
                        let mel = kaldi_mel(width * i as f64);
                        let up = (mel - left) / (center - left);
                        let down = (right - mel) / (right - center);
                        up.min(down).max(0.0)
                    })
                    .collect()
            })
            .collect();
        Bank::from_dense(&dense)
    }
}

/// Kaldi filter banks of the first channel of `samples` at `rate` (torchaudio uses channel 0
/// too), `[frames, bins]` row by row (plus a first column of log energies with `use_energy`).
/// `rng` supplies the dither, if any.
pub fn fbank(
    samples: &[f32],
    rate: u32,
    o: &FbankOptions,
    rng: &mut SampleRng,
) -> Result<(Vec<f32>, usize, usize), String> {
    let (size, shift, padded) = o.check(rate)?;
    let n = samples.len();
    let frames = if o.snip_edges {
        if n < size { 0 } else { 1 + (n - size) / shift }
    } else {
        (n + shift / 2) / shift
    };
    let cols = o.num_mel_bins + usize::from(o.use_energy);
    let window = o.window(size);
    let bank = o.bank(rate, padded);
    let plan = fft(padded);
    let mut input = plan.make_input_vec();
    let mut spectrum: Vec<Complex32> = plan.make_output_vec();
    let mut scratch = plan.make_scratch_vec();
    let mut power = vec![0f32; spectrum.len()];
    let mut frame = vec![0f64; size];
    let mut out = vec![0f32; frames * cols];
    let scale = o.scale;
    for t in 0..frames {
        // Kaldi's frame placement: snipped, or centred with reflection at the ends.
        let start = if o.snip_edges {
            (t * shift) as isize
        } else {
            (t * shift + shift / 2) as isize - (size / 2) as isize
        };
        for (k, x) in frame.iter_mut().enumerate() {
            let i = start + k as isize;
            let i = if i < 0 {
                (-i - 1) as usize
            } else if i as usize >= n {
                (2 * n) - 1 - i as usize
            } else {
                i as usize
            };
            *x = f64::from(samples[i.min(n - 1)]) * scale;
        }
        if o.dither != 0.0 {
            for x in frame.iter_mut() {
                *x += o.dither * gaussian(rng);
            }
        }
        if o.remove_dc_offset {
            let mean = frame.iter().sum::<f64>() / size as f64;
            frame.iter_mut().for_each(|x| *x -= mean);
        }
        let log_energy = |fr: &[f64]| {
            let e = fr
                .iter()
                .map(|x| x * x)
                .sum::<f64>()
                .max(f64::from(EPSILON))
                .ln();
            if o.energy_floor > 0.0 {
                e.max(o.energy_floor.ln())
            } else {
                e
            }
        };
        let mut energy = if o.raw_energy {
            log_energy(&frame)
        } else {
            0.0
        };
        if o.preemphasis_coefficient != 0.0 {
            for k in (1..size).rev() {
                frame[k] -= o.preemphasis_coefficient * frame[k - 1];
            }
            frame[0] -= o.preemphasis_coefficient * frame[0];
        }
        for (x, w) in frame.iter_mut().zip(&window) {
            *x *= w;
        }
        if !o.raw_energy {
            energy = log_energy(&frame);
        }
        for (k, x) in input.iter_mut().enumerate() {
            *x = frame.get(k).map_or(0.0, |&v| v as f32);
        }
        plan.process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .map_err(|e| e.to_string())?;
        for (p, c) in power.iter_mut().zip(&spectrum) {
            *p = if o.use_power { c.norm_sqr() } else { c.norm() };
        }
        let row = &mut out[t * cols..(t + 1) * cols];
        let (energy_col, bins) = row.split_at_mut(usize::from(o.use_energy));
        if let Some(e) = energy_col.first_mut() {
            *e = energy as f32;
        }
        for (b, v) in bins.iter_mut().enumerate() {
            let e = bank.apply(b, &power);
            *v = if o.use_log_fbank {
                e.max(EPSILON).ln()
            } else {
                e
            };
        }
    }
    if o.subtract_mean && frames > 0 {
        for c in 0..cols {
            let mean = (0..frames).map(|t| out[t * cols + c]).sum::<f32>() / frames as f32;
            (0..frames).for_each(|t| out[t * cols + c] -= mean);
        }
    }
    Ok((out, frames, cols))
}

/// A standard normal draw (Box-Muller).
fn gaussian(rng: &mut SampleRng) -> f64 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// SpecAugment's masks on features laid out `rows x cols`, time along `time_axis` (0: rows):
/// `freq_masks` bands of up to `freq_width` bins and `time_masks` spans of up to
/// `time_width` frames (at most `max_time_ratio` of the frames), set to `value`. Each mask's
/// width is drawn as torchaudio draws it (`uniform(0, width)`, floored), then its start
/// uniformly among the places it fits.
#[allow(clippy::too_many_arguments)]
pub fn spec_augment(
    data: &mut [f32],
    rows: usize,
    cols: usize,
    time_axis: usize,
    masks: [(usize, usize); 2],
    max_time_ratio: f64,
    value: f32,
    rng: &mut SampleRng,
) {
    let (frames, bins) = if time_axis == 0 {
        (rows, cols)
    } else {
        (cols, rows)
    };
    let [(freq_masks, freq_width), (time_masks, time_width)] = masks;
    let at = |t: usize, b: usize| {
        if time_axis == 0 {
            t * cols + b
        } else {
            b * cols + t
        }
    };
    let span = |size: usize, width: usize, rng: &mut SampleRng| -> (usize, usize) {
        let w = ((rng.next_f64() * width as f64) as usize).min(size);
        let start = (rng.next_f64() * (size - w) as f64) as usize;
        (start, w)
    };
    for _ in 0..freq_masks {
        let (s, w) = span(bins, freq_width, rng);
        for b in s..s + w {
            (0..frames).for_each(|t| data[at(t, b)] = value);
        }
    }
    let cap = ((frames as f64 * max_time_ratio) as usize).min(time_width);
    for _ in 0..time_masks {
        let (s, w) = span(frames, cap, rng);
        for t in s..s + w {
            (0..bins).for_each(|b| data[at(t, b)] = value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_filters_match_librosa() {
        // librosa.filters.mel(sr=16000, n_fft=400, n_mels=80): row 0's first weight, row 79's nonzero range.
        let b = slaney_bank(16_000, 400, 80);
        let (first, w) = &b.rows[0];
        assert_eq!(*first, 1);
        assert!((w[0] - 0.024_862_59).abs() < 1e-7, "{}", w[0]);
        let (first, w) = &b.rows[79];
        assert_eq!((*first, first + w.len()), (186, 200));
    }

    #[test]
    fn log_mel_of_silence_and_of_a_tone() {
        let (m, frames) = log_mel(&[0.0; 1600], 80, Some(480_000));
        assert_eq!(frames, 3000);
        assert_eq!(m.len(), 80 * 3000);
        assert!(m.iter().all(|&v| (v - (-10.0 + 4.0) / 4.0).abs() < 1e-6));
        let tone: Vec<f32> = (0..16_000)
            .map(|i| (2.0 * std::f32::consts::PI * 1000.0 * i as f32 / 16_000.0).sin() * 0.5)
            .collect();
        let (m, frames) = log_mel(&tone, 80, None);
        assert_eq!(frames, 100);
        let column = |t: usize| (0..80).map(|b| m[b * frames + t]).collect::<Vec<_>>();
        let c = column(50);
        let peak = (0..80).max_by(|&a, &b| c[a].total_cmp(&c[b])).unwrap();
        // 1 kHz falls in Slaney bin 25 of 80 at 16 kHz.
        assert!((24..=26).contains(&peak), "{peak}");
    }

    #[test]
    fn fbank_shapes_and_checks() {
        let mut rng = SampleRng::for_sample(0, 0, 0);
        let x: Vec<f32> = (0..16_000)
            .map(|i| ((i % 97) as f32 / 97.0) - 0.5)
            .collect();
        let (f, frames, cols) = fbank(&x, 16_000, &FbankOptions::default(), &mut rng).unwrap();
        assert_eq!((frames, cols), (98, 23));
        assert!(f.iter().all(|v| v.is_finite()));
        let bad = FbankOptions {
            window_type: "kaiser".into(),
            ..FbankOptions::default()
        };
        assert!(fbank(&x, 16_000, &bad, &mut rng).is_err());
        assert_eq!(
            fbank(&x[..100], 16_000, &FbankOptions::default(), &mut rng)
                .unwrap()
                .1,
            0
        );
    }

    #[test]
    fn spec_augment_masks_along_the_right_axes() {
        let mut d = vec![1f32; 10 * 20];
        let mut rng = SampleRng::for_sample(1, 2, 3);
        spec_augment(&mut d, 10, 20, 1, [(1, 5), (1, 8)], 1.0, 0.0, &mut rng);
        let zeros = d.iter().filter(|&&v| v == 0.0).count();
        assert!(zeros > 0 && zeros < 200);
        // Each masked bin row is zero across all frames or each masked frame across all bins.
        for b in 0..10 {
            let row = &d[b * 20..(b + 1) * 20];
            let whole = row.iter().all(|&v| v == 0.0);
            let some = row.iter().filter(|&&v| v == 0.0).count();
            assert!(whole || some <= 8);
        }
    }
}
