//! Opus packets decoded at 48 kHz, as FFmpeg decodes them. Two decoders:
//!
//! - **libopus**, the reference decoder (FFmpeg's `libopus` decoder, browsers), loaded from the
//!   system the first time an Opus stream is met (`libopus.so.0`; on Debian and Ubuntu the
//!   package `libopus0`): nothing is linked when chute is built, so a machine without libopus
//!   builds and runs chute, and only decoding an Opus stream fails, saying what to install. The
//!   default: on this project's machines it decodes 5-15% faster than FFmpeg 5.1's own decoder.
//! - **FFmpeg's own** (`libavcodec`'s `opus`, what torchcodec and PyAV decode with), where chute
//!   is built with FFmpeg's libraries (cargo feature `video`) and the environment variable
//!   `CHUTE_OPUS_DECODER` is `ffmpeg` (read once per process): the peers' samples exactly
//!   (2e-7 from PyAV's decode, where libopus differs by up to 3e-4). A channel mapping that
//!   FFmpeg refuses goes to libopus.
//!
//! Opus decoders need not be bit-identical. The stream's `OpusHead` (the Ogg identification
//! header, or Matroska's `CodecPrivate`) gives the channels, the pre-skip, the output gain and,
//! for more than two channels, the multistream mapping; chute applies the gain and the
//! pre-skip itself for either decoder.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::OpError;

/// The rate Opus decodes at.
pub(crate) const RATE: u32 = 48_000;

/// The most frames one packet decodes to (120 ms at 48 kHz).
pub(crate) const MAX_PACKET_FRAMES: usize = 5760;

/// An `OpusHead`'s fields (RFC 7845, section 5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) channels: usize,
    pub(crate) pre_skip: usize,
    /// Q7.8 dB.
    gain: i16,
    family: u8,
    streams: u8,
    coupled: u8,
    mapping: Vec<u8>,
}

impl Head {
    /// Parses an `OpusHead`, if `data` is one.
    pub(crate) fn parse(data: Option<&[u8]>) -> Option<Head> {
        let d = data?;
        if d.len() < 19 || &d[..8] != b"OpusHead" {
            return None;
        }
        let channels = usize::from(d[9]);
        let pre_skip = usize::from(u16::from_le_bytes([d[10], d[11]]));
        let gain = i16::from_le_bytes([d[16], d[17]]);
        let family = d[18];
        let (streams, coupled, mapping) = if family == 0 {
            (1, u8::from(channels == 2), (0..channels as u8).collect())
        } else {
            let table = d.get(19..21 + channels)?;
            (table[0], table[1], table[2..].to_vec())
        };
        Some(Head {
            channels,
            pre_skip,
            gain,
            family,
            streams,
            coupled,
            mapping,
        })
    }

    /// This header as an `OpusHead` with no pre-skip and no gain (the caller applies both),
    /// for a decoder that reads the header itself.
    #[cfg(feature = "video")]
    fn without_skip_and_gain(&self) -> Vec<u8> {
        let mut h = b"OpusHead".to_vec();
        h.extend_from_slice(&[1, self.channels as u8, 0, 0]);
        h.extend_from_slice(&RATE.to_le_bytes());
        h.extend_from_slice(&[0, 0, self.family]);
        if self.family != 0 {
            h.extend_from_slice(&[self.streams, self.coupled]);
            h.extend_from_slice(&self.mapping);
        }
        h
    }
}

/// Whether libopus decodes Opus in this process where FFmpeg could: unless
/// `CHUTE_OPUS_DECODER=ffmpeg` (see the module documentation).
#[cfg(feature = "video")]
fn use_libopus() -> bool {
    static LIBOPUS: OnceLock<bool> = OnceLock::new();
    *LIBOPUS.get_or_init(|| {
        !std::env::var("CHUTE_OPUS_DECODER").is_ok_and(|v| v.eq_ignore_ascii_case("ffmpeg"))
    })
}

type Create = unsafe extern "C" fn(i32, c_int, *mut c_int) -> *mut c_void;
type DecodeFloat =
    unsafe extern "C" fn(*mut c_void, *const u8, i32, *mut f32, c_int, c_int) -> c_int;
type Destroy = unsafe extern "C" fn(*mut c_void);
type MsCreate =
    unsafe extern "C" fn(i32, c_int, c_int, c_int, *const u8, *mut c_int) -> *mut c_void;
type StrError = unsafe extern "C" fn(c_int) -> *const c_char;

/// libopus's entry points.
struct Lib {
    create: Create,
    decode: DecodeFloat,
    destroy: Destroy,
    ms_create: MsCreate,
    ms_decode: DecodeFloat,
    ms_destroy: Destroy,
    strerror: StrError,
    /// Keeps the library mapped while the pointers above are used.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("libopus")
    }
}

/// The names libopus goes by, most specific first.
const NAMES: &[&str] = &[
    "libopus.so.0",
    "libopus.so",
    "libopus.0.dylib",
    "libopus.dylib",
    "opus.dll",
];

fn lib() -> Result<&'static Lib, OpError> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let mut tried = Vec::new();
        for name in NAMES {
            // SAFETY: loading libopus runs no initialisation code with preconditions; it is a
            // plain C library.
            match unsafe { libloading::Library::new(*name) } {
                Ok(lib) => return load(lib).map_err(|e| format!("{name}: {e}")),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "Opus audio needs libopus, which is not installed (install it: `apt-get install \
             libopus0` on Debian and Ubuntu, `brew install opus` on macOS); tried {}",
            tried.join("; ")
        ))
    })
    .as_ref()
    .map_err(|why| OpError::UnsupportedAudio {
        reason: why.clone(),
    })
}

fn load(lib: libloading::Library) -> Result<Lib, libloading::Error> {
    // SAFETY: each symbol is looked up with the C signature libopus declares in opus.h and
    // opus_multistream.h (stable since libopus 1.0); the pointers are used only while `_lib`
    // keeps the library loaded (it lives in a static, never unloaded).
    unsafe {
        Ok(Lib {
            create: *lib.get::<Create>(b"opus_decoder_create\0")?,
            decode: *lib.get::<DecodeFloat>(b"opus_decode_float\0")?,
            destroy: *lib.get::<Destroy>(b"opus_decoder_destroy\0")?,
            ms_create: *lib.get::<MsCreate>(b"opus_multistream_decoder_create\0")?,
            ms_decode: *lib.get::<DecodeFloat>(b"opus_multistream_decode_float\0")?,
            ms_destroy: *lib.get::<Destroy>(b"opus_multistream_decoder_destroy\0")?,
            strerror: *lib.get::<StrError>(b"opus_strerror\0")?,
            _lib: lib,
        })
    }
}

fn describe(lib: &Lib, code: c_int) -> String {
    // SAFETY: opus_strerror returns a pointer to a static NUL-terminated string for any code.
    let s = unsafe { std::ffi::CStr::from_ptr((lib.strerror)(code)) };
    format!("libopus: {} ({code})", s.to_string_lossy())
}

/// One stream's decoder.
#[derive(Debug)]
pub(crate) struct Decoder {
    engine: Engine,
    channels: usize,
    gain: f32,
    /// Frames still to drop at the start (the pre-skip), for containers whose packets do not
    /// carry it (Matroska).
    skip: usize,
    trimmed_by_container: bool,
    pcm: Vec<f32>,
}

/// The decoder behind a [`Decoder`].
enum Engine {
    /// A libopus decoder state (plain or multistream).
    Libopus {
        lib: &'static Lib,
        state: *mut c_void,
        multistream: bool,
    },
    /// FFmpeg's own Opus decoder.
    #[cfg(feature = "video")]
    Ffmpeg(ffmpeg::Opus),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Engine::Libopus { .. } => f.write_str("libopus"),
            #[cfg(feature = "video")]
            Engine::Ffmpeg(_) => f.write_str("FFmpeg"),
        }
    }
}

// SAFETY: a libopus decoder state is plain memory owned by this value, used by one thread at
// a time (`&mut self`), freed once in `drop`; FFmpeg's decoder context likewise.
unsafe impl Send for Decoder {}

impl Decoder {
    /// A decoder for the stream `head` (its `OpusHead`) describes; `channels` when it has
    /// none (a container that gives only the count: one or two channels).
    pub(crate) fn new(head: Option<&[u8]>, channels: usize) -> Result<Decoder, OpError> {
        let head = Head::parse(head).unwrap_or(Head {
            channels,
            pre_skip: 0,
            gain: 0,
            family: 0,
            streams: 1,
            coupled: u8::from(channels == 2),
            mapping: (0..channels as u8).collect(),
        });
        let bad = |why: String| OpError::CorruptAudio {
            reason: format!("Opus header: {why}"),
        };
        if head.channels == 0 || (head.family == 0 && head.channels > 2) {
            return Err(bad(format!(
                "{} channels with mapping family {}",
                head.channels, head.family
            )));
        }
        if head.mapping.len() != head.channels || head.coupled > head.streams || head.streams == 0 {
            return Err(bad("a channel mapping that does not fit its streams".into()));
        }
        #[cfg(feature = "video")]
        let engine = if use_libopus() {
            libopus_engine(&head)?
        } else {
            // A channel mapping this FFmpeg does not take (families it does not know) goes
            // to libopus, where it is installed.
            match ffmpeg::Opus::new(&head) {
                Ok(dec) => Engine::Ffmpeg(dec),
                Err(e) => libopus_engine(&head).map_err(|_| e)?,
            }
        };
        #[cfg(not(feature = "video"))]
        let engine = libopus_engine(&head)?;
        Ok(Decoder {
            engine,
            channels: head.channels,
            gain: 10f32.powf(f32::from(head.gain) / (20.0 * 256.0)),
            skip: head.pre_skip,
            trimmed_by_container: false,
            pcm: vec![0.0; MAX_PACKET_FRAMES * head.channels],
        })
    }

    pub(crate) fn channels(&self) -> usize {
        self.channels
    }

    /// The output gain the header asks for (a factor; 1 for most streams).
    pub(crate) fn gain(&self) -> f32 {
        self.gain
    }

    /// Frames to drop at the start of a packet of `n` frames, given what the container trims
    /// of it (`container_trim`): the pre-skip (what is left of it), unless the container
    /// trims it itself (Ogg does, Matroska does not).
    pub(crate) fn start_trim(&mut self, container_trim: usize, n: usize) -> usize {
        if container_trim > 0 {
            self.trimmed_by_container = true;
        }
        if self.trimmed_by_container {
            return container_trim.min(n);
        }
        let now = self.skip.min(n);
        self.skip -= now;
        now
    }

    /// The interleaved samples of the last packet decoded (`n` frames).
    pub(crate) fn pcm(&self, n: usize) -> &[f32] {
        &self.pcm[..n * self.channels]
    }

    /// Decodes one packet; gives its frames (see [`Decoder::pcm`]).
    pub(crate) fn decode(&mut self, packet: &[u8]) -> Result<usize, OpError> {
        match &mut self.engine {
            Engine::Libopus {
                lib,
                state,
                multistream,
            } => libopus_decode(lib, *state, *multistream, packet, &mut self.pcm),
            #[cfg(feature = "video")]
            Engine::Ffmpeg(dec) => dec.decode(packet, self.channels, &mut self.pcm),
        }
    }
}

/// A libopus decoder for `head` (checked by the caller).
fn libopus_engine(head: &Head) -> Result<Engine, OpError> {
    let lib = lib()?;
    let mut err: c_int = 0;
    let channels = head.channels as c_int;
    let multistream = head.family != 0;
    // SAFETY: the arguments are in libopus's documented ranges (48 kHz; 1 or 2 channels for a
    // plain decoder; for a multistream decoder a mapping of `channels` bytes, which libopus
    // validates against the stream counts); `err` is a valid out pointer.
    let state = unsafe {
        if multistream {
            (lib.ms_create)(
                RATE as i32,
                channels,
                c_int::from(head.streams),
                c_int::from(head.coupled),
                head.mapping.as_ptr(),
                &mut err,
            )
        } else {
            (lib.create)(RATE as i32, channels, &mut err)
        }
    };
    if state.is_null() || err != 0 {
        return Err(OpError::CorruptAudio {
            reason: format!("Opus header: {}", describe(lib, err)),
        });
    }
    Ok(Engine::Libopus {
        lib,
        state,
        multistream,
    })
}

/// Decodes `packet` with a libopus state into `pcm` (interleaved, `MAX_PACKET_FRAMES` frames
/// of the state's channels); its frames.
fn libopus_decode(
    lib: &Lib,
    state: *mut c_void,
    multistream: bool,
    packet: &[u8],
    pcm: &mut [f32],
) -> Result<usize, OpError> {
    let len = i32::try_from(packet.len()).map_err(|_| OpError::CorruptAudio {
        reason: "an Opus packet larger than 2 GiB".into(),
    })?;
    let decode = if multistream {
        lib.ms_decode
    } else {
        lib.decode
    };
    // SAFETY: `state` is a live decoder whose channels `pcm` holds MAX_PACKET_FRAMES frames
    // of, the frame size passed; the packet pointer and length describe `packet` (an empty
    // packet is passed as null, libopus's packet-loss call).
    let n = unsafe {
        decode(
            state,
            if packet.is_empty() {
                std::ptr::null()
            } else {
                packet.as_ptr()
            },
            len,
            pcm.as_mut_ptr(),
            MAX_PACKET_FRAMES as c_int,
            0,
        )
    };
    if n < 0 {
        return Err(OpError::CorruptAudio {
            reason: describe(lib, n),
        });
    }
    Ok(n as usize)
}

impl Drop for Decoder {
    fn drop(&mut self) {
        match &self.engine {
            Engine::Libopus {
                lib,
                state,
                multistream,
            } => {
                // SAFETY: `state` was created by the matching create call and is freed once.
                unsafe {
                    if *multistream {
                        (lib.ms_destroy)(*state);
                    } else {
                        (lib.destroy)(*state);
                    }
                }
            }
            // FFmpeg's context frees itself.
            #[cfg(feature = "video")]
            Engine::Ffmpeg(_) => {}
        }
    }
}

/// FFmpeg's own Opus decoder (`libavcodec`'s `opus`), on the calling thread.
#[cfg(feature = "video")]
mod ffmpeg {
    use ff::ffi;
    use ffmpeg_next as ff;

    use super::{Head, MAX_PACKET_FRAMES, RATE};
    use crate::OpError;
    use crate::video::{ffmpeg_said, init};

    fn corrupt(why: String) -> OpError {
        OpError::CorruptAudio {
            reason: format!("FFmpeg's Opus decoder: {why}{}", ffmpeg_said()),
        }
    }

    pub(super) struct Opus {
        dec: ff::decoder::Audio,
        frame: ff::frame::Audio,
    }

    impl Opus {
        /// A decoder of the streams `head` describes, told no pre-skip and no gain.
        pub(super) fn new(head: &Head) -> Result<Opus, OpError> {
            init();
            let _ = ffmpeg_said();
            let codec = ff::decoder::find(ff::codec::Id::OPUS).ok_or_else(|| {
                OpError::UnsupportedAudio {
                    reason: "this FFmpeg has no Opus decoder (leave CHUTE_OPUS_DECODER unset \
                             to decode with libopus)"
                        .into(),
                }
            })?;
            let mut ctx = ff::codec::context::Context::new_with_codec(codec);
            let extra = head.without_skip_and_gain();
            // SAFETY: `ctx` owns an unopened AVCodecContext; its extradata is allocated with
            // av_mallocz (with FFmpeg's input padding), which the context frees when it drops.
            unsafe {
                let c = ctx.as_mut_ptr();
                let pad = ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize;
                let buf = ffi::av_mallocz(extra.len() + pad).cast::<u8>();
                if buf.is_null() {
                    return Err(corrupt("out of memory".into()));
                }
                std::ptr::copy_nonoverlapping(extra.as_ptr(), buf, extra.len());
                (*c).extradata = buf;
                (*c).extradata_size = extra.len() as i32;
                (*c).sample_rate = RATE as i32;
                (*c).thread_count = 1;
            }
            let dec = ctx
                .decoder()
                .audio()
                .map_err(|e| corrupt(format!("the header: {e}")))?;
            Ok(Opus {
                dec,
                frame: ff::frame::Audio::empty(),
            })
        }

        /// Decodes `packet` into `pcm` (interleaved, `MAX_PACKET_FRAMES` frames of
        /// `channels`); its frames. An empty packet decodes to nothing, as FFmpeg's demuxers
        /// leave it.
        pub(super) fn decode(
            &mut self,
            packet: &[u8],
            channels: usize,
            pcm: &mut [f32],
        ) -> Result<usize, OpError> {
            if packet.is_empty() {
                return Ok(0);
            }
            let p = ff::Packet::copy(packet);
            self.dec
                .send_packet(&p)
                .map_err(|e| corrupt(format!("a packet: {e}")))?;
            let mut n = 0;
            loop {
                match self.dec.receive_frame(&mut self.frame) {
                    Ok(()) => {}
                    Err(ff::Error::Other { errno }) if errno == ffi::EAGAIN => return Ok(n),
                    Err(ff::Error::Eof) => return Ok(n),
                    Err(e) => return Err(corrupt(format!("a packet: {e}"))),
                }
                // SAFETY: the frame was just decoded; its fields are read as FFmpeg set them,
                // its planes (FLTP: one of `nb_samples` floats per channel) only after the
                // format and channel count are checked.
                unsafe {
                    let f = self.frame.as_ptr();
                    let samples = usize::try_from((*f).nb_samples).unwrap_or(0);
                    if (*f).format != ffi::AVSampleFormat::AV_SAMPLE_FMT_FLTP as i32
                        || usize::try_from((*f).ch_layout.nb_channels) != Ok(channels)
                    {
                        return Err(corrupt(format!(
                            "frames of sample format {} and {} channels, not float planes of \
                             {channels}",
                            (*f).format,
                            (*f).ch_layout.nb_channels
                        )));
                    }
                    if n + samples > MAX_PACKET_FRAMES {
                        return Err(corrupt("a packet of more than 120 ms".into()));
                    }
                    for c in 0..channels {
                        let plane = std::slice::from_raw_parts(
                            (*(*f).extended_data.add(c)).cast::<f32>(),
                            samples,
                        );
                        for (k, &x) in plane.iter().enumerate() {
                            pcm[(n + k) * channels + c] = x;
                        }
                    }
                    n += samples;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_and_bad_ones_are_refused() {
        let mut h = b"OpusHead".to_vec();
        h.extend_from_slice(&[1, 2, 0x38, 0x01, 0x80, 0xbb, 0, 0, 0, 0, 0]);
        let head = Head::parse(Some(&h)).unwrap();
        assert_eq!(
            (head.channels, head.pre_skip, head.streams, head.coupled),
            (2, 312, 1, 1)
        );
        assert!(Head::parse(Some(b"OpusHead")).is_none());
        assert!(Head::parse(Some(b"OpusTags01234567890123")).is_none());
        // Family 1 with a mapping table cut short.
        let mut m = h.clone();
        m[9] = 6;
        m[18] = 1;
        m.extend_from_slice(&[4, 2, 0, 4]);
        assert!(Head::parse(Some(&m)).is_none());
    }
}
