//! Audio: decoding from bytes in memory, resampling, cropping and padding, and the features
//! speech models train on (feature `audio`).
//!
//! - [`decode`]: WAV (PCM integer and float, ADPCM), AIFF, CAF, FLAC, MP3, Ogg Vorbis, AAC-LC
//!   and ALAC in MP4/M4A (Symphonia's pure-Rust demuxers and decoders), and Opus in Ogg and
//!   MKV/WebM (the packets demuxed by Symphonia, decoded by the system's libopus, loaded the
//!   first time an Opus stream is met, or on request by FFmpeg's own decoder in builds with
//!   feature `video`: see `opus.rs`), to `float32` `[channels, frames]` in
//!   [-1, 1]. Integer PCM is scaled as soundfile scales it (`x / 2^(bits-1)`); the encoders'
//!   delay and padding frames (MP3's LAME header, Opus's pre-skip, Vorbis, AAC in MP4 where the
//!   container says) are trimmed, as FFmpeg trims them. [`Audio::mono`] is the mean of the
//!   channels, as `datasets`' `Audio` gives it.
//! - [`probe`]: codec, container, rate, channels and duration from the headers ([`AudioInfo`]),
//!   for `chute inspect`.
//! - [`resample`]: to another rate with a band-limited windowed-sinc filter ([`resample`]'s
//!   docs give its passband and stopband).
//! - [`features`]: Whisper's log-mel spectrogram, Kaldi's filter banks and SpecAugment's masks.
//!
//! Limits, checked before and while decoding: at most [`AudioLimits::max_channels`] channels,
//! a rate of at most [`AudioLimits::max_rate`], and at most [`AudioLimits::max_seconds`] of
//! audio decoded (a header's claim is never allocated: buffers grow as packets decode, so a
//! header claiming hours of 384 kHz audio costs nothing, and a stream that decodes past the
//! limit is refused when it gets there).

use std::io::Cursor;

use bytes::Bytes;
use symphonia::core::codecs::audio::well_known::CODEC_ID_OPUS;
use symphonia::core::codecs::audio::{AudioCodecParameters, AudioDecoderOptions};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

use crate::OpError;

pub mod features;
mod mkv;
mod mp4;
pub(crate) mod opus;
pub mod resample;

/// Decoded audio: `float32` samples, planar (`[channels, frames]`, each channel's frames
/// together).
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Frames per second.
    pub rate: u32,
    /// The number of channels.
    pub channels: usize,
    /// The samples, `channels * frames` of them, channel by channel.
    pub data: Vec<f32>,
}

impl Audio {
    /// Frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.data.len().checked_div(self.channels).unwrap_or(0)
    }

    /// Seconds of audio.
    pub fn seconds(&self) -> f64 {
        self.frames() as f64 / f64::from(self.rate.max(1))
    }

    /// Channel `c`'s samples.
    pub fn channel(&self, c: usize) -> &[f32] {
        let n = self.frames();
        &self.data[c * n..(c + 1) * n]
    }

    /// One channel, the mean of all (as `datasets`' `Audio(mono=True)` and torchaudio's
    /// `mean(dim=0)` give it).
    pub fn mono(self) -> Audio {
        if self.channels <= 1 {
            return self;
        }
        let n = self.frames();
        let mut out = self.channel(0).to_vec();
        for c in 1..self.channels {
            for (o, x) in out.iter_mut().zip(self.channel(c)) {
                *o += x;
            }
        }
        let scale = 1.0 / self.channels as f32;
        out.iter_mut().for_each(|x| *x *= scale);
        debug_assert_eq!(out.len(), n);
        Audio {
            rate: self.rate,
            channels: 1,
            data: out,
        }
    }
}

/// Bounds on what a stream may declare or decode to (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AudioLimits {
    /// Most channels (default 64).
    pub max_channels: usize,
    /// Highest sample rate (default 768,000).
    pub max_rate: u32,
    /// Most seconds decoded (default 3,600).
    pub max_seconds: f64,
}

impl Default for AudioLimits {
    fn default() -> Self {
        AudioLimits {
            max_channels: 64,
            max_rate: 768_000,
            max_seconds: 3600.0,
        }
    }
}

/// What a stream's headers say.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioInfo {
    /// The container (`wav`, `flac`, `ogg`, `mkv`, `isomp4`, `mp3`, ...).
    pub container: &'static str,
    /// The codec (`pcm_s16le`, `flac`, `mp3`, `vorbis`, `opus`, `aac`, `alac`, ...).
    pub codec: String,
    /// Frames per second (Opus: 48,000, the rate it decodes at).
    pub rate: u32,
    /// Channels.
    pub channels: usize,
    /// Frames, where the container says.
    pub frames: Option<u64>,
}

impl AudioInfo {
    /// Seconds, where the container gives the frames.
    pub fn seconds(&self) -> Option<f64> {
        self.frames.map(|n| n as f64 / f64::from(self.rate.max(1)))
    }
}

/// A stream opened: its demuxer, the audio track's id and parameters.
struct Opened {
    reader: Box<dyn FormatReader>,
    track: u32,
    params: AudioCodecParameters,
    frames: Option<u64>,
    info: AudioInfo,
}

fn corrupt(e: SymError) -> OpError {
    match e {
        SymError::Unsupported(what) => OpError::UnsupportedAudio {
            reason: what.to_string(),
        },
        SymError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            OpError::CorruptAudio {
                reason: "the stream ends in the middle of a packet (a truncated file)".into(),
            }
        }
        other => OpError::CorruptAudio {
            reason: other.to_string(),
        },
    }
}

/// Opens `bytes`' container (told by its content) and finds its first audio track.
fn open(bytes: &Bytes, limits: &AudioLimits) -> Result<Opened, OpError> {
    if bytes.is_empty() {
        return Err(OpError::NotAudio {
            len: 0,
            head: Vec::new(),
        });
    }
    wave_format_check(bytes, limits)?;
    let patched = wave_sizes(bytes);
    let source = MediaSourceStream::new(
        Box::new(Cursor::new(patched.unwrap_or_else(|| bytes.clone()))),
        MediaSourceStreamOptions::default(),
    );
    let reader = symphonia::default::get_probe()
        .probe(
            &Hint::new(),
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            SymError::Unsupported(_) | SymError::IoError(_) => OpError::NotAudio {
                len: bytes.len(),
                head: bytes[..bytes.len().min(8)].to_vec(),
            },
            other => corrupt(other),
        })?;
    let track = reader
        .default_track(TrackType::Audio)
        .or_else(|| reader.first_track(TrackType::Audio))
        .ok_or_else(|| OpError::CorruptAudio {
            reason: format!("the {} container holds no audio track", short(&*reader)),
        })?;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .cloned()
        .ok_or_else(|| OpError::UnsupportedAudio {
            reason: "the audio track's codec is not known".into(),
        })?;
    let opus = params.codec == CODEC_ID_OPUS;
    let channels = params.channels.as_ref().map_or(0, |c| c.count());
    let channels = if opus {
        opus::Head::parse(params.extra_data.as_deref())
            .map(|h| h.channels)
            .unwrap_or(channels)
    } else {
        channels
    };
    let rate = if opus {
        opus::RATE
    } else {
        params.sample_rate.unwrap_or(0)
    };
    if channels > limits.max_channels {
        return Err(OpError::AudioTooLarge {
            reason: format!(
                "{channels} channels, more than max_channels = {}",
                limits.max_channels
            ),
        });
    }
    if rate > limits.max_rate {
        return Err(OpError::AudioTooLarge {
            reason: format!(
                "a rate of {rate} Hz, more than max_rate = {}",
                limits.max_rate
            ),
        });
    }
    let codec = if opus {
        "opus".to_string()
    } else {
        symphonia::default::get_codecs()
            .get_audio_decoder(params.codec)
            .map_or_else(
                || format!("codec {}", params.codec),
                |r| r.codec.info.short_name.to_string(),
            )
    };
    let frames = track.num_frames;
    let info = AudioInfo {
        container: short(&*reader),
        codec,
        rate,
        channels,
        frames,
    };
    Ok(Opened {
        track: track.id,
        reader,
        params,
        frames,
        info,
    })
}

/// A WAV file whose sizes do not fit its bytes, with sizes that do, as FFmpeg and libsndfile
/// read it: a `data` chunk declared as 0 or 0xFFFFFFFF bytes (written by a tool that could not
/// seek back, such as FFmpeg writing to a pipe) or as more bytes than follow runs to the end
/// of the file, and the RIFF size covers the file. `None` when the sizes fit (no copy).
fn wave_sizes(bytes: &Bytes) -> Option<Bytes> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let mut at = 12usize;
    while let Some(head) = bytes.get(at..at + 8) {
        let size = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if &head[..4] == b"data" {
            let rest = bytes.len() - (at + 8);
            let riff = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
            let fits = size != 0 && size != u32::MAX && size as usize <= rest;
            if fits && riff >= at + size as usize {
                return None;
            }
            let mut copy = bytes.to_vec();
            let data = if fits {
                size
            } else {
                u32::try_from(rest).unwrap_or(u32::MAX)
            };
            copy[at + 4..at + 8].copy_from_slice(&data.to_le_bytes());
            let riff = u32::try_from(bytes.len() - 8).unwrap_or(u32::MAX);
            copy[4..8].copy_from_slice(&riff.to_le_bytes());
            return Some(Bytes::from(copy));
        }
        at = at.checked_add(8 + size as usize + (size as usize & 1))?;
    }
    None
}

/// A WAV file's `fmt ` chunk checked before Symphonia reads it (wherever its probe would
/// find the file's start): its channel count within `limits` and its sample size within 64
/// bits (Symphonia multiplies them in 16 bits).
fn wave_format_check(bytes: &[u8], limits: &AudioLimits) -> Result<(), OpError> {
    // Found by their `WAVE` tag (memchr's vectorized search: every decode runs this over the
    // whole file, and the tag is rare in other data).
    for tag in memchr::memmem::find_iter(bytes, b"WAVE").filter(|&t| t >= 8) {
        let b = &bytes[tag - 8..];
        if matches!(&b[..4], b"RIFF" | b"RIFX" | b"RF64") {
            wave_format(b, limits)?;
        }
    }
    Ok(())
}

fn wave_format(bytes: &[u8], limits: &AudioLimits) -> Result<(), OpError> {
    let big = &bytes[..4] == b"RIFX";
    let u16_at = |at: usize| -> Option<u16> {
        let b: [u8; 2] = bytes.get(at..at + 2)?.try_into().ok()?;
        Some(if big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    };
    // Every `fmt ` chunk before the samples (a reader may take any of them, however the chunk
    // sizes lie), the samples starting at the first `data`.
    let header = bytes[12..]
        .windows(4)
        .position(|w| w == b"data")
        .map_or(bytes.len(), |p| p + 12);
    for at in (12..header.saturating_sub(3)).filter(|&at| &bytes[at..at + 4] == b"fmt ") {
        let (Some(channels), Some(bits)) = (u16_at(at + 10), u16_at(at + 22)) else {
            continue;
        };
        let channels = usize::from(channels);
        if channels > limits.max_channels {
            return Err(OpError::AudioTooLarge {
                reason: format!(
                    "{channels} channels, more than max_channels = {}",
                    limits.max_channels
                ),
            });
        }
        if bits > 64 {
            return Err(OpError::CorruptAudio {
                reason: format!("a WAV format of {bits} bits per sample"),
            });
        }
    }
    Ok(())
}

fn short(reader: &dyn FormatReader) -> &'static str {
    reader.format_info().short_name
}

/// Runs a third-party demuxer or decoder: a panic on malformed data (an arithmetic overflow
/// on a hostile header, in a build that checks) is the data's error, not the process's, and
/// prints nothing ([`chute_core::quiet::catch_quietly`]).
fn guarded<T>(f: impl FnOnce() -> Result<T, OpError>) -> Result<T, OpError> {
    chute_core::quiet::catch_quietly(f).unwrap_or_else(|why| {
        Err(OpError::CorruptAudio {
            reason: format!("the decoder failed on malformed data ({why})"),
        })
    })
}

/// What `bytes`' headers say (nothing is decoded).
pub fn probe(bytes: &Bytes) -> Result<AudioInfo, OpError> {
    guarded(|| Ok(open(bytes, &AudioLimits::default())?.info))
}

/// Decodes `bytes` (any container and codec listed in the module docs, told by the content)
/// to `float32` `[channels, frames]`, within `limits`. A stream that decodes to clearly fewer
/// frames than its header declares (an MP3's Xing/Info frame count, FLAC's STREAMINFO, an
/// MP4's duration) is refused as truncated, as FFmpeg refuses it.
pub fn decode(bytes: &Bytes, limits: &AudioLimits) -> Result<Audio, OpError> {
    guarded(|| decode_unguarded(bytes, limits))
}

fn decode_unguarded(bytes: &Bytes, limits: &AudioLimits) -> Result<Audio, OpError> {
    let Opened {
        mut reader,
        track,
        params,
        frames,
        info,
    } = open(bytes, limits)?;
    let max_frames = (limits.max_seconds * f64::from(info.rate.max(1))) as u64;
    // Room for what the container declares, never more than the limit or what the bytes
    // could plausibly hold (a header's claim alone allocates nothing large).
    let plausible = (bytes.len() as u64).saturating_mul(16);
    let reserve = frames.unwrap_or(0).min(max_frames).min(plausible) as usize;
    let mut planes: Vec<Vec<f32>> = Vec::new();
    let sink = |got: usize, planes: &mut Vec<Vec<f32>>| -> Result<(), OpError> {
        let total = planes.first().map_or(0, Vec::len) + got;
        if total as u64 > max_frames {
            return Err(OpError::AudioTooLarge {
                reason: format!(
                    "more than max_seconds = {} s of audio ({} frames at {} Hz)",
                    limits.max_seconds, max_frames, info.rate
                ),
            });
        }
        Ok(())
    };
    if params.codec == CODEC_ID_OPUS {
        let mut dec = opus::Decoder::new(params.extra_data.as_deref(), info.channels)?;
        let (channels, gain) = (dec.channels(), dec.gain());
        planes = vec![Vec::with_capacity(reserve); channels];
        while let Some(packet) = reader.next_packet().map_err(corrupt)? {
            if packet.track_id != track {
                continue;
            }
            let n = dec.decode(&packet.data)?;
            let start = dec.start_trim(packet.trim_start.get() as usize, n);
            let pcm = dec.pcm(n);
            let end = n.saturating_sub(packet.trim_end.get() as usize).max(start);
            sink(end - start, &mut planes)?;
            for (c, plane) in planes.iter_mut().enumerate() {
                plane.extend(
                    pcm[start * channels..end * channels]
                        .iter()
                        .skip(c)
                        .step_by(channels)
                        .map(|&x| x * gain),
                );
            }
        }
    } else {
        let mut dec = symphonia::default::get_codecs()
            .make_audio_decoder(&params, &AudioDecoderOptions::default())
            .map_err(corrupt)?;
        loop {
            let packet = match reader.next_packet() {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => return Err(corrupt(e)),
            };
            if packet.track_id != track {
                continue;
            }
            let buf = dec.decode(&packet).map_err(corrupt)?;
            let (n, c) = (buf.frames(), buf.num_planes());
            if planes.is_empty() {
                if c == 0 || c > limits.max_channels {
                    return Err(OpError::CorruptAudio {
                        reason: format!("a packet decodes to {c} channels"),
                    });
                }
                planes = vec![Vec::with_capacity(reserve); c];
            } else if c != planes.len() {
                return Err(OpError::CorruptAudio {
                    reason: format!(
                        "the channel count changes from {} to {c} mid-stream",
                        planes.len()
                    ),
                });
            }
            sink(n, &mut planes)?;
            let at = planes[0].len();
            for p in &mut planes {
                p.resize(at + n, 0.0);
            }
            let mut dst: Vec<&mut [f32]> = planes.iter_mut().map(|p| &mut p[at..]).collect();
            buf.copy_to_slice_planar::<f32, _>(&mut dst);
        }
    }
    if planes.is_empty() {
        return Err(OpError::CorruptAudio {
            reason: "the stream holds no audio packets".into(),
        });
    }
    // What the containers say of the encoder's delay and padding where Symphonia does not
    // trim them, as FFmpeg trims them: MP4's edit list (AAC's priming frames) at the start,
    // Matroska's `DiscardPadding` (Opus's last packet's padding) at the end.
    let start = match info.container {
        "isomp4" => mp4::priming(bytes, track, info.rate).unwrap_or(0) as usize,
        _ => 0,
    };
    let have = planes[0].len();
    let end = match info.container {
        "matroska" | "mkv" => {
            let ns = mkv::discard_padding_ns(bytes, track);
            let pad = (i128::from(ns) * i128::from(info.rate) / 1_000_000_000) as usize;
            // Only padding is cut: at most one packet's worth.
            have.saturating_sub(pad.min(opus::MAX_PACKET_FRAMES))
        }
        _ => have,
    };
    let start = start.min(end);
    if start > 0 || end < have {
        for p in &mut planes {
            p.truncate(end);
            p.drain(..start);
        }
    }
    // Codecs whose headers count the frames (not WAV's or AIFF's byte sizes, which tools
    // write as placeholders and readers take as "to the end").
    let counted = matches!(info.container, "mp3" | "flac" | "isomp4" | "ogg");
    let got = planes[0].len() as u64;
    if let Some(declared) = frames.filter(|_| counted)
        && got + (declared / 100).max(4096) < declared
    {
        return Err(OpError::CorruptAudio {
            reason: format!(
                "the {} header declares {declared} frames, the stream holds {got} (a truncated \
                 file)",
                info.container
            ),
        });
    }
    let channels = planes.len();
    let data = if channels == 1 {
        planes.pop().expect("one plane")
    } else {
        planes.concat()
    };
    Ok(Audio {
        rate: info.rate,
        channels,
        data,
    })
}

/// `audio` cut or zero-padded to `n` frames: from the start, or from an offset drawn
/// uniformly among the clips that fit (`offset`, given as a number in [0, 1)). Gives the audio
/// and the number of frames holding audio (the rest is padding).
pub fn crop(audio: &Audio, n: usize, offset: Option<f64>) -> (Audio, usize) {
    let frames = audio.frames();
    let start = match offset {
        Some(u) if frames > n => ((u * (frames - n + 1) as f64) as usize).min(frames - n),
        _ => 0,
    };
    let kept = frames.saturating_sub(start).min(n);
    let mut data = vec![0f32; audio.channels * n];
    for c in 0..audio.channels {
        data[c * n..c * n + kept].copy_from_slice(&audio.channel(c)[start..start + kept]);
    }
    (
        Audio {
            rate: audio.rate,
            channels: audio.channels,
            data,
        },
        kept,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 16-bit PCM WAV file of `samples` (interleaved).
    pub(crate) fn wav(rate: u32, channels: u16, samples: &[i16]) -> Bytes {
        let data_len = (samples.len() * 2) as u32;
        let mut b = Vec::new();
        b.extend_from_slice(b"RIFF");
        b.extend_from_slice(&(36 + data_len).to_le_bytes());
        b.extend_from_slice(b"WAVEfmt ");
        b.extend_from_slice(&16u32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&channels.to_le_bytes());
        b.extend_from_slice(&rate.to_le_bytes());
        b.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
        b.extend_from_slice(&(channels * 2).to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(b"data");
        b.extend_from_slice(&data_len.to_le_bytes());
        for s in samples {
            b.extend_from_slice(&s.to_le_bytes());
        }
        Bytes::from(b)
    }

    #[test]
    fn wav_decodes_to_planar_floats_scaled_as_soundfile_scales() {
        let bytes = wav(8000, 2, &[0, 16384, -32768, 32767, 1, -1]);
        let a = decode(&bytes, &AudioLimits::default()).unwrap();
        assert_eq!((a.rate, a.channels, a.frames()), (8000, 2, 3));
        assert_eq!(a.channel(0), &[0.0, -1.0, 1.0 / 32768.0]);
        assert_eq!(a.channel(1), &[0.5, 32767.0 / 32768.0, -1.0 / 32768.0]);
        let m = a.mono();
        assert_eq!(m.data, vec![0.25, -1.0 / 65536.0, 0.0]);
        let info = probe(&bytes).unwrap();
        assert_eq!(
            (info.container, info.rate, info.channels),
            ("wave", 8000, 2)
        );
        assert_eq!(info.frames, Some(3));
    }

    #[test]
    fn limits_refuse_before_and_while_decoding() {
        let bytes = wav(8000, 1, &vec![7i16; 8000 * 3]);
        let few = AudioLimits {
            max_seconds: 2.0,
            ..AudioLimits::default()
        };
        let e = decode(&bytes, &few).unwrap_err();
        assert!(e.to_string().contains("max_seconds"), "{e}");
        let low = AudioLimits {
            max_rate: 4000,
            ..AudioLimits::default()
        };
        assert!(
            decode(&bytes, &low)
                .unwrap_err()
                .to_string()
                .contains("max_rate")
        );
        // A header that claims hours of 384 kHz audio over a few bytes.
        let mut lying = wav(384_000, 8, &[1, 2, 3, 4, 5, 6, 7, 8]).to_vec();
        lying[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        lying[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let got = decode(&Bytes::from(lying), &AudioLimits::default());
        if let Ok(a) = got {
            assert!(a.frames() <= 1);
        }
    }

    #[test]
    fn a_wave_header_of_too_many_channels_is_refused_before_symphonia_reads_it() {
        let mut bytes = wav(8000, 1, &[1, 2, 3, 4]).to_vec();
        bytes[22..24].copy_from_slice(&65_535u16.to_le_bytes());
        let e = decode(&Bytes::from(bytes.clone()), &AudioLimits::default()).unwrap_err();
        assert!(matches!(e, OpError::AudioTooLarge { .. }), "{e}");
        // After leading garbage (the probe searches for the start), and in a second fmt chunk.
        let mut later = b"\xff\xff".to_vec();
        later.extend_from_slice(&bytes);
        assert!(decode(&Bytes::from(later), &AudioLimits::default()).is_err());
    }

    #[test]
    fn wave_sizes_that_do_not_fit_run_to_the_end_as_ffmpeg_reads_them() {
        let good = wav(8000, 1, &[1, 2, 3, 4]);
        assert!(wave_sizes(&good).is_none());
        for size in [0u32, u32::MAX, 1000] {
            let mut b = good.to_vec();
            b[40..44].copy_from_slice(&size.to_le_bytes());
            b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            let a = decode(&Bytes::from(b), &AudioLimits::default()).unwrap();
            assert_eq!(a.frames(), 4, "data size {size}");
        }
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        let e = decode(
            &Bytes::from_static(b"hello world, no audio"),
            &AudioLimits::default(),
        )
        .unwrap_err();
        assert!(matches!(e, OpError::NotAudio { .. }), "{e}");
        assert!(decode(&Bytes::new(), &AudioLimits::default()).is_err());
        let bytes = wav(8000, 1, &[5; 100]);
        for cut in [10, 30, 44, 45] {
            let _ = decode(&bytes.slice(..cut), &AudioLimits::default());
        }
    }

    #[test]
    fn crop_pads_with_zeros_and_counts_the_audio() {
        let a = Audio {
            rate: 10,
            channels: 2,
            data: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        let (c, kept) = crop(&a, 5, None);
        assert_eq!(kept, 3);
        assert_eq!(
            c.data,
            vec![1.0, 2.0, 3.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0]
        );
        let (c, kept) = crop(&a, 2, Some(0.99));
        assert_eq!((kept, c.data), (2, vec![2.0, 3.0, 5.0, 6.0]));
        let (c, _) = crop(&a, 2, Some(0.0));
        assert_eq!(c.data, vec![1.0, 2.0, 4.0, 5.0]);
    }
}
