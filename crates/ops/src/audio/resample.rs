//! Band-limited resampling: a polyphase Kaiser-windowed sinc filter, designed as soxr's "high
//! quality" preset is specified (librosa's default, `soxr.resample`'s `HQ`): flat to 91.3% of
//! the lower rate's Nyquist frequency, at least 120 dB down from that Nyquist frequency on,
//! linear phase, with no delay (output sample `k` is the signal at input time
//! `k * from / to`, so the first samples line up as soxr's and torchaudio's do).
//!
//! The filter's -6 dB point is the middle of the transition band (95.65% of Nyquist); its
//! length follows Kaiser's formula for 120 dB over the 8.7% transition (about 500 input
//! samples per output sample when going from 44.1 or 48 kHz to 16 kHz). For a ratio
//! `to / from = L / M` (in lowest terms) the filter is tabulated for each of the `L` phases
//! once per rate pair and process (up to 1,024 phases; rarer ratios compute their taps for each
//! output sample), each phase scaled to a gain of exactly 1 at 0 Hz. The signal is taken as
//! zero outside the clip; the output has `frames * to / from` frames, rounded to the nearest
//! (as soxr's output has).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use realfft::num_complex::Complex32;
use realfft::{ComplexToReal, RealToComplex};

use super::Audio;

/// Where the passband ends, as a fraction of the lower rate's Nyquist frequency.
pub const PASSBAND: f64 = 0.913;
/// The stopband's attenuation, dB.
pub const ATTENUATION_DB: f64 = 120.0;
/// The most phases tabulated.
const MAX_PHASES: usize = 1024;

/// A rate pair's filter.
#[derive(Debug)]
struct Filter {
    /// Output frames per `step` input frames (`L`).
    up: usize,
    /// `M`.
    down: usize,
    /// Taps on each side of the output time (`W`): `2W` taps per output sample.
    half: usize,
    /// `up * 2W` taps, phase by phase, when tabulated.
    table: Option<Vec<f32>>,
    /// The ideal low-pass's cutoff, as a fraction of the input's Nyquist frequency.
    cutoff: f64,
    beta: f64,
    /// The same filter applied by FFT (see [`Spectral`]), where the ratio allows.
    spectral: Option<Spectral>,
}

/// The filter applied in the frequency domain, the way FFT resamplers work (overlap-add over
/// chunks of `n_in = M * k` input frames, each `n_out = L * k` output frames): a chunk's
/// spectrum times the filter's, cut (or zero-extended) to the output's bins, transformed
/// back. The filter is the one the polyphase table holds (the same Kaiser-windowed sinc,
/// sampled at the input frames, centred `delay * M / L` frames in so that its delay is a whole
/// `delay` output frames): the two agree to float32 rounding (about 1e-6), and this one costs
/// a few transforms per chunk instead of `2W` multiply-adds per output frame.
struct Spectral {
    /// Input frames per chunk.
    n_in: usize,
    /// Output frames per chunk.
    n_out: usize,
    /// The inverse transform's size (the forward's is `fft_out * M / L`).
    fft_out: usize,
    delay: usize,
    /// The filter's spectrum, scaled by one over the forward transform's size.
    h: Vec<Complex32>,
    forward: Arc<dyn RealToComplex<f32>>,
    inverse: Arc<dyn ComplexToReal<f32>>,
}

impl std::fmt::Debug for Spectral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spectral")
            .field("n_in", &self.n_in)
            .field("n_out", &self.n_out)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

/// The longest chunk the FFT path takes (rarer ratios use the polyphase table or taps).
const MAX_CHUNK: usize = 1 << 17;

impl Spectral {
    fn new(f: &Filter) -> Option<Spectral> {
        let (l, m) = (f.up, f.down);
        let w = f.half as f64;
        // The delay in output frames, a whole number, at least the filter's half-width.
        let delay = (w * l as f64 / m as f64).ceil() as usize;
        let center = delay as f64 * m as f64 / l as f64;
        let taps = (center + w).floor() as usize + 1;
        // Chunks of about eight filter lengths, transformed with room for the filter's tail
        // (`fft_in = M * k2 >= n_in + taps`): most of each transform is output.
        let k = (8 * taps).max(4096).div_ceil(m);
        let (n_in, n_out) = (m.checked_mul(k)?, l.checked_mul(k)?);
        // Transform sizes of small prime factors only (a size with a large one is several
        // times slower), where the rates allow.
        let smooth = |n: usize| {
            let mut n = n;
            for p in [2, 3, 5, 7] {
                while n > 1 && n.is_multiple_of(p) {
                    n /= p;
                }
            }
            n == 1
        };
        let least = (n_in + taps).div_ceil(m);
        let k2 = (least..least + 256)
            .find(|&k2| smooth(k2 * m) && smooth(k2 * l))
            .unwrap_or(least);
        let (fft_in, fft_out) = (m.checked_mul(k2)?, l.checked_mul(k2)?);
        if fft_in > MAX_CHUNK || fft_out > MAX_CHUNK {
            return None;
        }
        let i0_beta = bessel_i0(f.beta);
        let mut h = vec![0f32; fft_in];
        let mut sum = 0.0;
        let mut wide = vec![0f64; taps];
        for (n, t) in wide.iter_mut().enumerate() {
            let tau = n as f64 - center;
            let x = tau / w;
            if x.abs() < 1.0 {
                let arg = std::f64::consts::PI * f.cutoff * tau;
                let sinc = if arg.abs() < 1e-12 {
                    1.0
                } else {
                    arg.sin() / arg
                };
                *t = f.cutoff * sinc * bessel_i0(f.beta * (1.0 - x * x).sqrt()) / i0_beta;
                sum += *t;
            }
        }
        let scale = 1.0 / (sum * fft_in as f64);
        for (o, t) in h.iter_mut().zip(&wide) {
            *o = (t * scale) as f32;
        }
        let (forward, inverse) = {
            let mut planner = super::features::planner()
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            (
                planner.plan_fft_forward(fft_in),
                planner.plan_fft_inverse(fft_out),
            )
        };
        let mut spectrum = forward.make_output_vec();
        forward.process(&mut h, &mut spectrum).ok()?;
        Some(Spectral {
            n_in,
            n_out,
            fft_out,
            delay,
            h: spectrum,
            forward,
            inverse,
        })
    }

    /// `x` resampled: `out.len()` frames.
    fn run(&self, x: &[f32], out: &mut [f32]) {
        let (n_in, n_out, fft_out) = (self.n_in, self.n_out, self.fft_out);
        let needed = self.delay + out.len();
        let chunks = x.len().div_ceil(n_in).max(needed.div_ceil(n_out)).max(1);
        let mut acc = vec![0f32; chunks * n_out + fft_out];
        let mut input = self.forward.make_input_vec();
        let mut spec_in = self.forward.make_output_vec();
        let mut spec_out = self.inverse.make_input_vec();
        let mut time = self.inverse.make_output_vec();
        let mut scratch_f = self.forward.make_scratch_vec();
        let mut scratch_i = self.inverse.make_scratch_vec();
        // The bins both spectra have; the output's last bin is real when its size is even.
        let shared = (spec_in.len() - 1).min(spec_out.len() - 1);
        for c in 0..chunks {
            let start = c * n_in;
            if start >= x.len() {
                break;
            }
            let part = &x[start..(start + n_in).min(x.len())];
            input[..part.len()].copy_from_slice(part);
            input[part.len()..].fill(0.0);
            self.forward
                .process_with_scratch(&mut input, &mut spec_in, &mut scratch_f)
                .expect("buffers made by the plan");
            for ((o, a), h) in spec_out[..=shared].iter_mut().zip(&spec_in).zip(&self.h) {
                *o = a * h;
            }
            spec_out[shared + 1..].fill(Complex32::new(0.0, 0.0));
            spec_out[0].im = 0.0;
            if fft_out.is_multiple_of(2) {
                spec_out[fft_out / 2].im = 0.0;
            }
            self.inverse
                .process_with_scratch(&mut spec_out, &mut time, &mut scratch_i)
                .expect("buffers made by the plan");
            for (a, t) in acc[c * n_out..c * n_out + fft_out].iter_mut().zip(&time) {
                *a += t;
            }
        }
        out.copy_from_slice(&acc[self.delay..self.delay + out.len()]);
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The zeroth-order modified Bessel function of the first kind (its power series).
fn bessel_i0(x: f64) -> f64 {
    let (mut sum, mut term, q) = (1.0, 1.0, x * x / 4.0);
    for k in 1..200 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

impl Filter {
    fn new(from: u32, to: u32) -> Filter {
        let g = gcd(u64::from(from), u64::from(to));
        let (up, down) = ((u64::from(to) / g) as usize, (u64::from(from) / g) as usize);
        let lower = f64::from(from.min(to));
        let from = f64::from(from);
        // Transition band from PASSBAND to 1 of the lower Nyquist, in radians per input sample.
        let width = std::f64::consts::PI * (1.0 - PASSBAND) * lower / from;
        let taps = (ATTENUATION_DB - 7.95) / (2.285 * width);
        let half = ((taps / 2.0).ceil() as usize).max(2);
        let beta = 0.1102 * (ATTENUATION_DB - 8.7);
        let cutoff = (1.0 + PASSBAND) / 2.0 * lower / from;
        let mut f = Filter {
            up,
            down,
            half,
            table: None,
            cutoff,
            beta,
            spectral: None,
        };
        f.spectral = Spectral::new(&f);
        if f.spectral.is_some() {
            return f;
        }
        if up <= MAX_PHASES {
            let mut table = vec![0f32; up * 2 * half];
            for p in 0..up {
                f.taps(
                    p as f64 / up as f64,
                    &mut table[p * 2 * half..(p + 1) * 2 * half],
                );
            }
            f.table = Some(table);
        }
        f
    }

    /// The taps for an output time `frac` of an input sample past the sample before it: tap
    /// `j` weighs input sample `n0 - W + 1 + j`.
    fn taps(&self, frac: f64, out: &mut [f32]) {
        let w = self.half as f64;
        let i0_beta = bessel_i0(self.beta);
        let mut sum = 0.0;
        let mut wide = vec![0f64; out.len()];
        for (j, t) in wide.iter_mut().enumerate() {
            let tau = frac + w - 1.0 - j as f64;
            let x = tau / w;
            let window = if x.abs() >= 1.0 {
                0.0
            } else {
                bessel_i0(self.beta * (1.0 - x * x).sqrt()) / i0_beta
            };
            let arg = std::f64::consts::PI * self.cutoff * tau;
            let sinc = if arg.abs() < 1e-12 {
                1.0
            } else {
                arg.sin() / arg
            };
            *t = self.cutoff * sinc * window;
            sum += *t;
        }
        for (o, t) in out.iter_mut().zip(&wide) {
            *o = (t / sum) as f32;
        }
    }
}

/// The filters made so far, by rate pair.
type Filters = Mutex<HashMap<(u32, u32), Arc<Filter>>>;

fn filter(from: u32, to: u32) -> Arc<Filter> {
    static CACHE: OnceLock<Filters> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(f) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(from, to))
    {
        return f.clone();
    }
    let f = Arc::new(Filter::new(from, to));
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((from, to))
        .or_insert(f)
        .clone()
}

/// `a . b`: with AVX2 and FMA where the CPU has them (detected once), else in eight lanes
/// the compiler vectorizes.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    s += acc.iter().sum::<f32>();
    s
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// [`dot_portable`] in four 8-lane fused multiply-add accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::{
        __m256, _mm_add_ps, _mm_cvtss_f32, _mm_hadd_ps, _mm256_add_ps, _mm256_castps256_ps128,
        _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps,
    };
    let n = a.len().min(b.len());
    let mut acc: [__m256; 4] = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8k + 8 <= i + 32 <= n, within both slices.
            unsafe {
                let x = _mm256_loadu_ps(a.as_ptr().add(i + 8 * k));
                let y = _mm256_loadu_ps(b.as_ptr().add(i + 8 * k));
                *lane = _mm256_fmadd_ps(x, y, *lane);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, within both slices.
        unsafe {
            let x = _mm256_loadu_ps(a.as_ptr().add(i));
            let y = _mm256_loadu_ps(b.as_ptr().add(i));
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        }
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    let quad = _mm_hadd_ps(half, half);
    let mut s = _mm_cvtss_f32(_mm_hadd_ps(quad, quad));
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// The frames `frames` input frames give at `to` from `from`: `frames * to / from` rounded
/// to the nearest (halves up), as soxr gives.
pub fn output_frames(frames: usize, from: u32, to: u32) -> usize {
    let from = u128::from(from.max(1));
    ((frames as u128 * u128::from(to) + from / 2) / from) as usize
}

/// `audio` at `to` frames per second (itself when the rate is already `to`).
pub fn resample(audio: &Audio, to: u32) -> Audio {
    if audio.rate == to || audio.rate == 0 || to == 0 {
        return audio.clone();
    }
    let f = filter(audio.rate, to);
    let frames = audio.frames();
    let out_frames = output_frames(frames, audio.rate, to);
    if let Some(spectral) = &f.spectral {
        let mut data = vec![0f32; out_frames * audio.channels];
        for c in 0..audio.channels {
            spectral.run(
                audio.channel(c),
                &mut data[c * out_frames..(c + 1) * out_frames],
            );
        }
        return Audio {
            rate: to,
            channels: audio.channels,
            data,
        };
    }
    let taps = 2 * f.half;
    let mut data = vec![0f32; out_frames * audio.channels];
    let mut padded = vec![0f32; frames + taps];
    let mut scratch = vec![0f32; if f.table.is_some() { 0 } else { taps }];
    for c in 0..audio.channels {
        padded[f.half..f.half + frames].copy_from_slice(audio.channel(c));
        let out = &mut data[c * out_frames..(c + 1) * out_frames];
        for (k, y) in out.iter_mut().enumerate() {
            let pos = k as u128 * f.down as u128;
            let n0 = (pos / f.up as u128) as usize;
            let phase = (pos % f.up as u128) as usize;
            let x = &padded[n0 + 1..n0 + 1 + taps];
            *y = match &f.table {
                Some(t) => dot(x, &t[phase * taps..(phase + 1) * taps]),
                None => {
                    f.taps(phase as f64 / f.up as f64, &mut scratch);
                    dot(x, &scratch)
                }
            };
        }
    }
    Audio {
        rate: to,
        channels: audio.channels,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, hz: f64, frames: usize) -> Audio {
        let data = (0..frames)
            .map(|i| (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin() as f32)
            .collect();
        Audio {
            rate,
            channels: 1,
            data,
        }
    }

    #[test]
    fn tones_in_the_passband_survive_and_above_nyquist_vanish() {
        for (from, to) in [
            (48_000, 16_000),
            (44_100, 16_000),
            (22_050, 16_000),
            (16_000, 44_100),
        ] {
            let a = tone(from, 1000.0, from as usize);
            let r = resample(&a, to);
            assert_eq!(r.frames(), to as usize);
            let want = tone(to, 1000.0, to as usize);
            // Away from the edges (where the clip's ends are filtered as zeros).
            let m = to as usize / 10;
            let err = r.data[m..r.data.len() - m]
                .iter()
                .zip(&want.data[m..want.data.len() - m])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-4, "{from} -> {to}: {err}");
        }
        // 9 kHz at 48 kHz is above 16 kHz's Nyquist: gone.
        let r = resample(&tone(48_000, 9000.0, 48_000), 16_000);
        let peak = r.data[1600..14_400]
            .iter()
            .fold(0f32, |m, x| m.max(x.abs()));
        assert!(peak < 1e-5, "{peak}");
    }

    #[test]
    fn the_vector_dot_product_is_the_plain_one() {
        let a: Vec<f32> = (0..531).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..531).map(|i| (i as f32 * 0.11).cos()).collect();
        for n in [0, 1, 7, 8, 31, 32, 33, 500, 531] {
            let want: f64 = a[..n]
                .iter()
                .zip(&b[..n])
                .map(|(x, y)| f64::from(x * y))
                .sum();
            assert!(
                (f64::from(dot(&a[..n], &b[..n])) - want).abs() < 1e-3,
                "{n}"
            );
            assert!(
                (f64::from(dot_portable(&a[..n], &b[..n])) - want).abs() < 1e-3,
                "{n}"
            );
        }
    }

    #[test]
    fn coprime_rates_compute_their_taps_and_agree() {
        let a = tone(44_101, 440.0, 4410);
        let r = resample(&a, 16_000);
        assert_eq!(r.frames(), output_frames(4410, 44_101, 16_000));
        let want = tone(16_000, 440.0, r.frames());
        let err = r.data[400..1200]
            .iter()
            .zip(&want.data[400..1200])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "{err}");
    }
}
