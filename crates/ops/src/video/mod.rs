//! Video: clips of frames decoded from bytes in memory, sampled as video trainers sample them,
//! scaled and cropped in one pass (feature `video`).
//!
//! Decoding is FFmpeg's (libavformat's demuxers, libavcodec's decoders: H.264, H.265, VP8,
//! VP9, AV1, MPEG-4, ... in MP4/MOV, MKV/WebM, MPEG-TS, AVI, ..., whatever the system's
//! libraries were built with), linked dynamically through `ffmpeg-next`, one decoder thread
//! per call: chute's workers are the parallelism, so FFmpeg's threads never contend with
//! them.
//!
//! - **Frames are counted exactly**, as torchcodec's `seek_mode="exact"` counts them: one scan
//!   of the stream's packets (demuxing only) gives every frame's presentation time and the key
//!   frames; frame `i` is the `i`-th in presentation order.
//! - **Clips** ([`sample`]): `frames` frames `stride` apart (or at `fps`), `clips` of them,
//!   started at random (the sample's RNG) or regularly, completed past the end by a
//!   [`Policy`]: torchcodec's `clips_at_random_indices` / `clips_at_regular_indices` (and its
//!   timestamp samplers, where a frame's time is the one shown at that instant); or every
//!   clip that fits, `step` apart ([`Sampler::Every`]: DALI's `step` in frames,
//!   `clips_at_regular_timestamps` in seconds).
//! - **Exact seeking**: for each frame wanted, in presentation order, the demuxer seeks to
//!   the key frame at or before it only when that key frame is past what has been decoded;
//!   frames are matched by presentation time, so the frames a clip names are the frames
//!   delivered (a seek that lands late falls back to decoding from the start).
//! - **One scaling pass**: the crop (center, random, or torchvision's `RandomResizedCrop`)
//!   is taken from the decoded frame by moving its plane pointers (no copy), and libswscale
//!   converts it to RGB at the output size straight into the clip's buffer; the same crop for
//!   every frame of a sample. Without a resize or crop, frames come at the stream's size.
//! - **Limits** ([`VideoLimits`]): the stream's declared size is checked before a decoder is
//!   opened (and the decoder is told the same pixel limit), the frame table's length while
//!   scanning, and the clip's bytes before its buffer is allocated.

// FFmpeg's constants come from bindgen, typed as each FFmpeg version's headers type them: the
// casts to the C argument types are kept for all versions.
#![allow(clippy::unnecessary_cast)]

use std::io::Cursor;
use std::sync::Once;

use bytes::Bytes;
use chute_core::SampleRng;
use ff::ffi;
use ff::packet::Ref as _;
use ffmpeg_next as ff;

use crate::OpError;
use crate::image::{Rect, center_crop_offsets, random_resized_crop_params};

pub mod sample;
mod synthetic;
pub use sample::{FrameTable, Policy, Sampler, Sampling, Spacing};
pub use synthetic::synthetic_video;

/// Bounds on what one video may make chute allocate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoLimits {
    /// Most pixels a frame may have (default: the process's `max_image_pixels`).
    pub max_pixels: u64,
    /// Most frames a stream may have (default 1,000,000: nine hours at 30 fps).
    pub max_frames: usize,
    /// Most bytes one sample's clips may take (default 2 GiB).
    pub max_bytes: usize,
}

impl Default for VideoLimits {
    fn default() -> Self {
        VideoLimits {
            max_pixels: chute_core::Limits::current().max_image_pixels,
            max_frames: 1_000_000,
            max_bytes: 1 << 31,
        }
    }
}

/// What a video's headers and packets say (nothing is decoded).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoInfo {
    /// The container, as FFmpeg names its demuxer (`mov,mp4,m4a,3gp,3g2,mj2`, `matroska,webm`,
    /// `mpegts`, `avi`, ...).
    pub container: String,
    /// The codec (`h264`, `hevc`, `vp9`, `av1`, `mpeg4`, ...).
    pub codec: String,
    /// Width, pixels.
    pub width: u32,
    /// Height, pixels.
    pub height: u32,
    /// Average frames per second, where the stream says.
    pub fps: Option<f64>,
    /// Frames, counted from the packets.
    pub frames: usize,
    /// Seconds from the first frame's start to the last frame's end.
    pub duration: f64,
}

/// A resize before the crop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    /// The shorter side to this many pixels, the aspect ratio kept (torchvision's `Resize(n)`).
    Shorter(usize),
    /// Exactly `[height, width]`.
    Exact(usize, usize),
}

/// Where the crop is taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CropMode {
    /// The center (torchvision's `center_crop`; zero-padded where the crop is larger).
    Center,
    /// Anywhere, uniformly (the sample's RNG).
    Random,
    /// torchvision's `RandomResizedCrop`: an area fraction in `scale`, an aspect ratio in
    /// `ratio`, drawn on the frame, scaled to the crop size.
    RandomResized {
        /// Area fraction range.
        scale: [f64; 2],
        /// Aspect ratio (width / height) range.
        ratio: [f64; 2],
    },
}

/// What to decode from a video, and how to shape it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipRequest {
    /// Which frames (ignored when `indices` is given).
    pub sampling: Sampling,
    /// Exactly these frames, in this order.
    pub indices: Option<Vec<usize>>,
    /// The resize, before the crop.
    pub resize: Option<Resize>,
    /// The crop's `(height, width)`.
    pub crop: Option<(usize, usize)>,
    /// Where the crop is taken.
    pub crop_mode: CropMode,
    /// `[T, C, H, W]` frames instead of `[T, H, W, C]`.
    pub channels_first: bool,
    /// The bounds.
    pub limits: VideoLimits,
}

/// Decoded clips: `uint8` RGB frames and their presentation times.
#[derive(Debug, Clone, PartialEq)]
pub struct Clips {
    /// The frames, row-major in `shape`.
    pub data: Vec<u8>,
    /// `[T, H, W, 3]` (or `[T, 3, H, W]`), with a leading `clips` axis for several clips.
    pub shape: Vec<usize>,
    /// Each frame's presentation time, seconds, in `pts_shape`.
    pub pts: Vec<f64>,
    /// `[T]`, or `[clips, T]`.
    pub pts_shape: Vec<usize>,
}

/// FFmpeg's libraries set up once per process: its log lines kept per thread, never printed
/// (the audio ops' Opus decoder shares this).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Registers nothing on FFmpeg 5+; checks the libraries load. FFmpeg's error lines are
        // never printed: each is kept for the thread that logged it (decoders run on the
        // calling thread) and added to the error that follows.
        let _ = ff::init();
        ff::util::log::set_level(ff::util::log::Level::Error);
        // SAFETY: `keep_log` has the callback's C signature and may run on any thread.
        unsafe { ffi::av_log_set_callback(Some(keep_log)) };
    });
}

std::thread_local! {
    /// The errors FFmpeg logged on this thread since they were last taken.
    static LAST_LOG: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// FFmpeg's log callback: formats the line (FFmpeg's own formatter) and keeps it.
unsafe extern "C" fn keep_log(
    ptr: *mut std::ffi::c_void,
    level: std::ffi::c_int,
    fmt: *const std::ffi::c_char,
    vl: *mut ffi::__va_list_tag,
) {
    if level > ffi::AV_LOG_ERROR as std::ffi::c_int {
        return;
    }
    let mut line = [0 as std::ffi::c_char; 512];
    let mut prefix: std::ffi::c_int = 0;
    // SAFETY: FFmpeg passes its own format and argument list; the line buffer's size is given.
    let text = unsafe {
        ffi::av_log_format_line(ptr, level, fmt, vl, line.as_mut_ptr(), 512, &mut prefix);
        std::ffi::CStr::from_ptr(line.as_ptr())
    };
    let text = text.to_string_lossy().trim().to_string();
    let _ = LAST_LOG.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            // The first few different lines: a decoder's first line often says why.
            if l.len() < 400 && !l.split("; ").any(|x| x == text) {
                if !l.is_empty() {
                    l.push_str("; ");
                }
                l.push_str(&text);
            }
        }
    });
}

/// The lines FFmpeg logged on this thread since the last call (taken), as ` (FFmpeg: ...)`,
/// or nothing.
pub(crate) fn ffmpeg_said() -> String {
    let said = LAST_LOG
        .try_with(|l| {
            l.try_borrow_mut()
                .map(|mut l| std::mem::take(&mut *l))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    if said.is_empty() {
        String::new()
    } else {
        format!(" (FFmpeg: {said})")
    }
}

fn corrupt(reason: impl Into<String>) -> OpError {
    let mut reason = reason.into();
    let said = ffmpeg_said();
    if said.contains("max pixel") || said.contains("Picture size") {
        return OpError::VideoTooLarge {
            reason: format!(
                "the stream's own headers claim frames larger than max_pixels allows, or than \
                 FFmpeg decodes{said}"
            ),
        };
    }
    reason.push_str(&said);
    OpError::CorruptVideo { reason }
}

fn guarded<T>(f: impl FnOnce() -> Result<T, OpError>) -> Result<T, OpError> {
    chute_core::quiet::catch_quietly(f).unwrap_or_else(|why| {
        Err(corrupt(format!(
            "the decoder failed on malformed data ({why})"
        )))
    })
}

/// An opened container: its video stream, and the stream's packets in presentation order.
struct Demuxed {
    input: ff::format::context::Input,
    stream: usize,
    /// Seconds per tick of the stream's time base.
    tick: f64,
    /// Presentation times, ticks, ascending (one per frame).
    pts: Vec<i64>,
    /// The key frames' presentation times, ascending.
    keys: Vec<i64>,
    /// Where a seek to each key frame goes: its presentation time in containers that index
    /// their frames by it (MP4, Matroska), else its decode time (the generic seek, which
    /// MPEG-TS uses, compares decode times).
    key_seek: Vec<i64>,
    /// MP4/MOV or Matroska/WebM: the container indexes its frames.
    indexed: bool,
    /// The end of the last frame, ticks.
    end: i64,
    width: u32,
    height: u32,
}

/// The container opened over `bytes`. `analyze`: also run FFmpeg's stream analysis
/// (`avformat_find_stream_info`, which decodes frames: the average frame rate for
/// [`probe`]); without it, only for containers whose headers do not describe their streams
/// (all but MP4/MOV and Matroska/WebM) or leave the video stream's codec unknown.
fn demuxer(bytes: &Bytes, analyze: bool) -> Result<ff::format::context::Input, OpError> {
    let not_video = |e: ff::Error| {
        let n = bytes.len().min(8);
        OpError::NotVideo {
            len: bytes.len(),
            head: bytes[..n].to_vec(),
            reason: format!("{e}{}", ffmpeg_said()),
        }
    };
    let mut io = ff::format::context::StreamIo::from_read_seek(Cursor::new(bytes.clone()))
        .map_err(|e| corrupt(format!("cannot read the bytes: {e}")))?;
    // SAFETY: the format context is allocated here and given the StreamIo's AVIOContext;
    // `wrap_with_custom_io` then owns both (the StreamIo outlives the context's use of it).
    // On failure avformat_open_input frees the context, and the StreamIo drops.
    unsafe {
        let mut ps = ffi::avformat_alloc_context();
        if ps.is_null() {
            return Err(corrupt("out of memory opening the container"));
        }
        (*ps).pb = io.as_mut_ptr();
        (*ps).flags |= ffi::AVFMT_FLAG_CUSTOM_IO as i32;
        let r = ffi::avformat_open_input(
            &mut ps,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null_mut(),
        );
        if r < 0 {
            return Err(not_video(ff::Error::from(r)));
        }
        // MP4/MOV and Matroska/WebM describe their streams fully in their headers (and
        // index them); other containers (MPEG-TS, AVI, elementary streams) are analyzed.
        let name = std::ffi::CStr::from_ptr((*(*ps).iformat).name).to_string_lossy();
        let described = matches!(name.as_ref(), "mov,mp4,m4a,3gp,3g2,mj2" | "matroska,webm");
        let known = (0..(*ps).nb_streams as usize).any(|i| {
            let par = (**(*ps).streams.add(i)).codecpar;
            (*par).codec_type == ffi::AVMediaType::AVMEDIA_TYPE_VIDEO
                && (*par).codec_id != ffi::AVCodecID::AV_CODEC_ID_NONE
        });
        if analyze || !known || !described {
            let r = ffi::avformat_find_stream_info(ps, std::ptr::null_mut());
            if r < 0 {
                ffi::avformat_close_input(&mut ps);
                return Err(not_video(ff::Error::from(r)));
            }
        }
        Ok(ff::format::context::Input::wrap_with_custom_io(ps, io))
    }
}

fn open(bytes: &Bytes, limits: &VideoLimits, analyze: bool) -> Result<Demuxed, OpError> {
    init();
    let _ = ffmpeg_said();
    let mut input = demuxer(bytes, analyze)?;
    let (stream, tb, width, height) = {
        let s = input
            .streams()
            .best(ff::media::Type::Video)
            .ok_or_else(|| OpError::NotVideo {
                len: bytes.len(),
                head: bytes[..bytes.len().min(8)].to_vec(),
                reason: "a container without a video stream".into(),
            })?;
        let par = s.parameters();
        // SAFETY: `par` wraps the stream's live AVCodecParameters; reading two ints.
        let (w, h) = unsafe {
            let p = par.as_ptr();
            ((*p).width, (*p).height)
        };
        (s.index(), s.time_base(), w, h)
    };
    let (width, height) = (
        u32::try_from(width).unwrap_or(0),
        u32::try_from(height).unwrap_or(0),
    );
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(OpError::VideoTooLarge {
            reason: format!(
                "frames of {width} x {height} declared, more than max_pixels ({})",
                limits.max_pixels
            ),
        });
    }
    if tb.numerator() <= 0 || tb.denominator() <= 0 {
        return Err(corrupt(format!("the stream's time base is {tb}")));
    }
    let tick = f64::from(tb.numerator()) / f64::from(tb.denominator());
    // The scan: every packet of the stream, demuxed, not decoded.
    let mut entries: Vec<(i64, i64, bool, i64)> = Vec::new();
    let mut packet = ff::Packet::empty();
    let mut skipped = 0usize;
    loop {
        match packet.read(&mut input) {
            Ok(()) => {}
            Err(ff::Error::Eof) => break,
            Err(ff::Error::InvalidData) if skipped < 16 => {
                skipped += 1;
                continue;
            }
            Err(e) => {
                return Err(corrupt(format!(
                    "the container is corrupt or cut short after {} frames: {e}",
                    entries.len()
                )));
            }
        }
        // SAFETY: `packet` holds the packet just read; reading its flags.
        let discard = unsafe { (*packet.as_ptr()).flags } & ffi::AV_PKT_FLAG_DISCARD as i32 != 0;
        // Packets an edit list cuts are demuxed but never shown: not frames.
        if packet.stream() != stream || packet.size() == 0 || discard {
            continue;
        }
        if packet.is_corrupt() {
            return Err(corrupt(format!(
                "packet {} is corrupt or cut short (a truncated file?)",
                entries.len()
            )));
        }
        let Some(pts) = packet.pts().or(packet.dts()) else {
            continue;
        };
        let dts = packet.dts().unwrap_or(pts);
        if entries.len() >= limits.max_frames {
            return Err(OpError::VideoTooLarge {
                reason: format!("more than max_frames ({}) frames", limits.max_frames),
            });
        }
        entries.push((pts, dts, packet.is_key(), packet.duration().max(0)));
    }
    // A container that declares its frame count (MP4) and delivers fewer is cut short.
    let declared = input.stream(stream).map_or(0, |s| s.frames());
    if declared > 0 && (entries.len() as i64) < declared {
        return Err(corrupt(format!(
            "the stream declares {declared} frames but holds {} (a truncated file?)",
            entries.len()
        )));
    }
    if entries.is_empty() {
        return Err(corrupt("the video stream has no frames"));
    }
    entries.sort_unstable_by_key(|e| e.0);
    entries.dedup_by_key(|e| e.0);
    let pts: Vec<i64> = entries.iter().map(|e| e.0).collect();
    let indexed = matches!(
        input.format().name(),
        "mov,mp4,m4a,3gp,3g2,mj2" | "matroska,webm"
    );
    let mut keys: Vec<(i64, i64)> = entries
        .iter()
        .filter(|e| e.2)
        .map(|e| (e.0, if indexed { e.0 } else { e.0.min(e.1) }))
        .collect();
    if keys.is_empty() {
        keys.push((pts[0], pts[0]));
    }
    let last = entries.last().expect("not empty");
    let end = last.0 + last.3.max(1);
    Ok(Demuxed {
        input,
        stream,
        tick,
        pts,
        keys: keys.iter().map(|k| k.0).collect(),
        key_seek: keys.iter().map(|k| k.1).collect(),
        indexed,
        end,
        width,
        height,
    })
}

/// What `bytes`' headers and packets say (nothing is decoded).
pub fn probe(bytes: &Bytes) -> Result<VideoInfo, OpError> {
    guarded(|| {
        let d = open(bytes, &VideoLimits::default(), true)?;
        let s = d
            .input
            .stream(d.stream)
            .ok_or_else(|| corrupt("the video stream went away"))?;
        let rate = s.avg_frame_rate();
        let fps = (rate.numerator() > 0 && rate.denominator() > 0).then(|| f64::from(rate));
        let codec = s.parameters().id().name().to_string();
        Ok(VideoInfo {
            container: d.input.format().name().to_string(),
            codec,
            width: d.width,
            height: d.height,
            fps,
            frames: d.pts.len(),
            duration: (d.end - d.pts[0]) as f64 * d.tick,
        })
    })
}

/// A decoder on a demuxed stream, delivering frames in presentation order.
struct Reader {
    d: Demuxed,
    dec: ff::decoder::Video,
    frame: ff::frame::Video,
    packet: ff::Packet,
    eof_sent: bool,
    /// The presentation times of the frames wanted (sorted): the packets of other frames
    /// are decoded only if other frames refer to them (`skip_frame` = non-reference frames).
    /// `None` decodes every frame.
    wanted: Option<Vec<i64>>,
    /// After a seek: packets are dropped until a key frame's (a demuxer that seeks by
    /// byte or decode time may land before one; the decoder then starts clean).
    need_key: bool,
}

impl Reader {
    fn new(d: Demuxed, limits: &VideoLimits) -> Result<Reader, OpError> {
        let par = d
            .input
            .stream(d.stream)
            .ok_or_else(|| corrupt("the video stream went away"))?
            .parameters();
        let mut ctx = ff::codec::context::Context::from_parameters(par)
            .map_err(|e| corrupt(format!("the codec parameters: {e}")))?;
        // SAFETY: `ctx` owns an unopened AVCodecContext; these fields are read when it opens.
        unsafe {
            let c = ctx.as_mut_ptr();
            (*c).thread_count = 1;
            // The limit, plus the padding codecs add to a declared size (macroblocks, CTUs):
            // a stream whose own headers claim more than its container is refused.
            let (w, h) = (u64::from(d.width), u64::from(d.height));
            let margin = if w * h > 0 {
                128 * (w + h) + 128 * 128
            } else {
                0
            };
            (*c).max_pixels =
                i64::try_from(limits.max_pixels.saturating_add(margin)).unwrap_or(i64::MAX);
        }
        let id = ctx.id();
        let dec = ctx
            .decoder()
            .video()
            .map_err(|e| OpError::UnsupportedVideo {
                reason: format!(
                    "no decoder for {} in this FFmpeg ({e}); install FFmpeg's libraries with it",
                    id.name()
                ),
            })?;
        Ok(Reader {
            d,
            dec,
            frame: ff::frame::Video::empty(),
            packet: ff::Packet::empty(),
            eof_sent: false,
            wanted: None,
            need_key: false,
        })
    }

    /// Seeks to key frame `k` (of the scan's) or one before it, and resets the decoder.
    fn seek(&mut self, k: usize) -> Result<(), OpError> {
        let ts = self.d.key_seek[k];
        // SAFETY: the input's format context is open; the stream index is one of its streams.
        let r = unsafe {
            ffi::av_seek_frame(
                self.d.input.as_mut_ptr(),
                self.d.stream as i32,
                ts,
                ffi::AVSEEK_FLAG_BACKWARD,
            )
        };
        self.reset(r)
    }

    /// Goes back to the stream's start: by byte position where the container is not indexed
    /// (a time seek there may land past the first frame), and resets the decoder.
    fn rewind(&mut self) -> Result<(), OpError> {
        if self.d.indexed {
            return self.seek(0);
        }
        self.reset(-1)
    }

    /// After a seek that returned `r`: on failure, rewinds by byte position; then resets the
    /// decoder, which starts again at a key frame.
    fn reset(&mut self, r: i32) -> Result<(), OpError> {
        if r < 0 {
            // Some demuxers cannot seek to an arbitrary time: rewind the bytes instead.
            // SAFETY: as above; seeking by byte position 0.
            let r = unsafe {
                ffi::av_seek_frame(
                    self.d.input.as_mut_ptr(),
                    self.d.stream as i32,
                    0,
                    ffi::AVSEEK_FLAG_BYTE,
                )
            };
            if r < 0 {
                return Err(corrupt(format!(
                    "cannot seek in the stream: {}",
                    ff::Error::from(r)
                )));
            }
        }
        self.dec.flush();
        self.eof_sent = false;
        self.need_key = true;
        Ok(())
    }

    /// Whether the decoder skips the non-reference frame a packet holds (a frame nothing
    /// else is decoded from: no other frame changes).
    fn skip_nonref(&mut self, skip: bool) {
        let mode = if skip {
            ffi::AVDiscard::AVDISCARD_NONREF
        } else {
            ffi::AVDiscard::AVDISCARD_DEFAULT
        };
        // SAFETY: the decoder's context is open; `skip_frame` is read when a packet decodes
        // (on this thread: one decoder thread).
        unsafe { (*self.dec.as_mut_ptr()).skip_frame = mode };
    }

    /// The next decoded frame's presentation time (the frame is in `self.frame`), or `None`
    /// at the end of the stream.
    fn next(&mut self) -> Result<Option<i64>, OpError> {
        loop {
            match self.dec.receive_frame(&mut self.frame) {
                Ok(()) => {
                    let Some(pts) = self.frame.pts().or(self.frame.timestamp()) else {
                        continue;
                    };
                    return Ok(Some(pts));
                }
                Err(ff::Error::Eof) => return Ok(None),
                Err(ff::Error::Other { errno }) if errno == ffi::EAGAIN => {}
                Err(e) => return Err(corrupt(format!("the decoder failed: {e}"))),
            }
            if self.eof_sent {
                return Ok(None);
            }
            // Feed the decoder the stream's next packet (or the end).
            loop {
                match self.packet.read(&mut self.d.input) {
                    Ok(()) if self.packet.stream() == self.d.stream => {
                        // A key frame by its flag, or by the scan's (a parser reset by the seek
                        // may not flag the first one it sees).
                        let scanned_key = self
                            .packet
                            .pts()
                            .is_some_and(|p| self.d.keys.binary_search(&p).is_ok());
                        if self.need_key && !self.packet.is_key() && !scanned_key {
                            continue;
                        }
                        self.need_key = false;
                        if let Some(wanted) = &self.wanted {
                            let pts = self.packet.pts().or(self.packet.dts());
                            let skip = match pts {
                                Some(p) => wanted.binary_search(&p).is_err(),
                                None => false,
                            };
                            self.skip_nonref(skip);
                        }
                        if let Err(e) = self.dec.send_packet(&self.packet) {
                            return Err(corrupt(format!("the decoder refused a packet: {e}")));
                        }
                        break;
                    }
                    Ok(()) => {}
                    Err(ff::Error::InvalidData) => {}
                    Err(_) => {
                        self.dec
                            .send_eof()
                            .map_err(|e| corrupt(format!("the decoder failed at the end: {e}")))?;
                        self.eof_sent = true;
                        break;
                    }
                }
            }
        }
    }
}

/// The source region a sample's frames are cropped to, as fractions of the frame, and where
/// it lands in the output frame.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Geometry {
    /// Output frame height and width.
    out: (usize, usize),
    /// Source region: top, left, height, width, as fractions of the frame's.
    src: [f64; 4],
    /// Where it is written in the output: top, left, height, width, pixels.
    dst: [usize; 4],
}

fn geometry(
    h: usize,
    w: usize,
    req: &ClipRequest,
    rng: &mut SampleRng,
) -> Result<Geometry, OpError> {
    let (fh, fw) = (h as f64, w as f64);
    let full = |oh: usize, ow: usize| Geometry {
        out: (oh, ow),
        src: [0.0, 0.0, 1.0, 1.0],
        dst: [0, 0, oh, ow],
    };
    let (rh, rw) = match req.resize {
        None => (h, w),
        Some(Resize::Exact(rh, rw)) => (rh, rw),
        Some(Resize::Shorter(s)) => {
            if h <= w {
                (s, ((s as f64 * fw / fh) as usize).max(1))
            } else {
                (((s as f64 * fh / fw) as usize).max(1), s)
            }
        }
    };
    let Some((ch, cw)) = req.crop else {
        return Ok(full(rh, rw));
    };
    match req.crop_mode {
        CropMode::RandomResized { scale, ratio } => {
            let Rect {
                top,
                left,
                height,
                width,
            } = random_resized_crop_params(h, w, scale, ratio, rng);
            Ok(Geometry {
                out: (ch, cw),
                src: [
                    top as f64 / fh,
                    left as f64 / fw,
                    height as f64 / fh,
                    width as f64 / fw,
                ],
                dst: [0, 0, ch, cw],
            })
        }
        mode => {
            let (top, left) = match mode {
                CropMode::Random if rh >= ch && rw >= cw => (
                    rng.below((rh - ch + 1) as u64) as isize,
                    rng.below((rw - cw + 1) as u64) as isize,
                ),
                _ => center_crop_offsets(rh, rw, ch, cw),
            };
            // The crop window in resized coordinates, cut to the frame (padding outside).
            let (y0, x0) = (top.max(0) as usize, left.max(0) as usize);
            let y1 = (top + ch as isize).min(rh as isize).max(0) as usize;
            let x1 = (left + cw as isize).min(rw as isize).max(0) as usize;
            if y1 <= y0 || x1 <= x0 {
                return Err(OpError::wrong_input(
                    "decode_video",
                    format!("a crop of {ch} x {cw} misses a frame of {rh} x {rw}"),
                ));
            }
            let (rhf, rwf) = (rh as f64, rw as f64);
            Ok(Geometry {
                out: (ch, cw),
                src: [
                    y0 as f64 / rhf,
                    x0 as f64 / rwf,
                    (y1 - y0) as f64 / rhf,
                    (x1 - x0) as f64 / rwf,
                ],
                dst: [
                    (y0 as isize - top) as usize,
                    (x0 as isize - left) as usize,
                    y1 - y0,
                    x1 - x0,
                ],
            })
        }
    }
}

/// libswscale's context for one conversion, kept while the frames' size stays the same.
struct Scaler {
    ctx: *mut ffi::SwsContext,
    /// A crop without scaling converts the region widened to even bounds (whole chroma
    /// samples) here, then copies the crop out: the pixels of a whole-frame conversion.
    scratch: Vec<u8>,
}

impl Drop for Scaler {
    fn drop(&mut self) {
        // SAFETY: `ctx` is null or a context from sws_getCachedContext, freed once here.
        unsafe { ffi::sws_freeContext(self.ctx) };
    }
}

impl Scaler {
    /// Converts the frame in `frame`, cropped to `g.src`, into RGB at `g.dst` of `out` (an
    /// output frame of `g.out`, `[H, W, 3]`).
    fn convert(
        &mut self,
        frame: &mut ff::frame::Video,
        g: &Geometry,
        out: &mut [u8],
    ) -> Result<(), OpError> {
        let (fh, fw) = (frame.height() as usize, frame.width() as usize);
        if fh == 0 || fw == 0 {
            return Err(corrupt("a decoded frame of size 0"));
        }
        let y = ((g.src[0] * fh as f64).round() as usize).min(fh - 1);
        let x = ((g.src[1] * fw as f64).round() as usize).min(fw - 1);
        let h = ((g.src[2] * fh as f64).round() as usize).clamp(1, fh - y);
        let w = ((g.src[3] * fw as f64).round() as usize).clamp(1, fw - x);
        let (ow, [dy, dx, dh, dw]) = (g.out.1, g.dst);
        let odd_end = |start: usize, len: usize, size: usize| {
            !(start + len).is_multiple_of(2) && start + len < size
        };
        if (h, w) == (dh, dw)
            && (!y.is_multiple_of(2)
                || !x.is_multiple_of(2)
                || odd_end(y, h, fh)
                || odd_end(x, w, fw))
        {
            // No scaling, at odd bounds: convert the region widened to even bounds, then
            // copy the crop (a crop of chroma at an odd offset would shift it by half a pixel).
            let (y0, x0) = (y & !1, x & !1);
            let (y1, x1) = ((y + h + 1).min(fh) & !1, (x + w + 1).min(fw) & !1);
            let (y1, x1) = (y1.max(y + h).min(fh), x1.max(x + w).min(fw));
            let (rh, rw) = (y1 - y0, x1 - x0);
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.resize(rh * rw * 3, 0);
            let wide = Geometry {
                out: (rh, rw),
                src: [
                    y0 as f64 / fh as f64,
                    x0 as f64 / fw as f64,
                    rh as f64 / fh as f64,
                    rw as f64 / fw as f64,
                ],
                dst: [0, 0, rh, rw],
            };
            let r = self.convert(frame, &wide, &mut scratch);
            if r.is_ok() {
                for row in 0..h {
                    let s = ((y - y0 + row) * rw + (x - x0)) * 3;
                    let d = ((dy + row) * ow + dx) * 3;
                    out[d..d + w * 3].copy_from_slice(&scratch[s..s + w * 3]);
                }
            }
            self.scratch = scratch;
            return r;
        }
        // SAFETY: the pointer is used below while `frame` is borrowed mutably.
        let f = unsafe { frame.as_mut_ptr() };
        if (y, x, h, w) != (0, 0, fh, fw) {
            // SAFETY: `f` is the decoder's frame (its buffers referenced by it); cropping
            // moves its plane pointers inside those buffers and shrinks its size.
            let r = unsafe {
                (*f).crop_top = y;
                (*f).crop_left = x;
                (*f).crop_bottom = fh - y - h;
                (*f).crop_right = fw - x - w;
                ffi::av_frame_apply_cropping(f, ffi::AV_FRAME_CROP_UNALIGNED as i32)
            };
            if r < 0 {
                return Err(OpError::UnsupportedVideo {
                    reason: format!(
                        "cannot crop frames of this pixel format: {}",
                        ff::Error::from(r)
                    ),
                });
            }
        }
        // SAFETY: `f` is a valid decoded frame; the context is built for its size and
        // format; the destination window lies inside `out` ([out.0, out.1, 3], checked by
        // the caller's allocation) with a row stride of `ow * 3`.
        unsafe {
            let (sw, sh, fmt) = ((*f).width, (*f).height, (*f).format);
            self.ctx = ffi::sws_getCachedContext(
                self.ctx,
                sw,
                sh,
                std::mem::transmute::<i32, ffi::AVPixelFormat>(fmt),
                dw as i32,
                dh as i32,
                ffi::AVPixelFormat::AV_PIX_FMT_RGB24,
                ffi::SWS_BILINEAR as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null(),
            );
            if self.ctx.is_null() {
                return Err(OpError::UnsupportedVideo {
                    reason: format!("libswscale cannot convert pixel format {fmt} to RGB"),
                });
            }
            let start = (dy * ow + dx) * 3;
            let dst = [
                out.as_mut_ptr().add(start),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ];
            let stride = [(ow * 3) as i32, 0, 0, 0];
            let rows = ffi::sws_scale(
                self.ctx,
                (*f).data.as_ptr() as *const *const u8,
                (*f).linesize.as_ptr(),
                0,
                sh,
                dst.as_ptr(),
                stride.as_ptr(),
            );
            if rows != dh as i32 {
                return Err(corrupt(format!("libswscale converted {rows} of {dh} rows")));
            }
        }
        Ok(())
    }
}

/// Decodes the clips `req` asks for from `bytes` (any container and codec the system's
/// FFmpeg reads, told by the content); the random choices (clip starts, crops) come from
/// `rng`.
pub fn decode_clips(
    bytes: &Bytes,
    req: &ClipRequest,
    rng: &mut SampleRng,
) -> Result<Clips, OpError> {
    guarded(|| decode_unguarded(bytes, req, rng))
}

fn decode_unguarded(
    bytes: &Bytes,
    req: &ClipRequest,
    rng: &mut SampleRng,
) -> Result<Clips, OpError> {
    let d = open(bytes, &req.limits, false)?;
    let n = d.pts.len();
    let (indices, lead) = match &req.indices {
        Some(ix) => {
            if let Some(&bad) = ix.iter().find(|&&i| i >= n) {
                return Err(OpError::wrong_input(
                    "decode_video",
                    format!("frame index {bad}, but the video has {n} frames"),
                ));
            }
            (ix.clone(), vec![ix.len()])
        }
        None => {
            let table = FrameTable {
                pts: d.pts.iter().map(|&p| p as f64 * d.tick).collect(),
                end: d.end as f64 * d.tick,
            };
            let ix = sample::clip_indices(&req.sampling, &table, rng)
                .map_err(|why| OpError::wrong_input("decode_video", why))?;
            let s = &req.sampling;
            let lead = if let Sampler::Every(_) = s.sampler {
                vec![ix.len() / s.frames, s.frames]
            } else if s.clips > 1 {
                vec![s.clips, s.frames]
            } else {
                vec![s.frames]
            };
            (ix, lead)
        }
    };
    let total = indices.len();
    // The output's size, from the first frame decoded (the container's size may be absent),
    // and its buffer, allocated then.
    let mut layout: Option<(Geometry, usize)> = None;
    let mut data: Vec<u8> = Vec::new();
    let pts_out: Vec<f64> = indices.iter().map(|&i| d.pts[i] as f64 * d.tick).collect();
    // The frames wanted, in presentation order, each with the outputs that show it.
    let mut wanted: Vec<(usize, usize)> = indices.iter().copied().zip(0..).collect();
    wanted.sort_unstable();
    let key_at = |pts: i64, d: &Demuxed| -> usize {
        d.keys.partition_point(|&k| k <= pts).saturating_sub(1)
    };
    let mut reader = Reader::new(d, &req.limits)?;
    let mut wanted_pts: Vec<i64> = wanted.iter().map(|&(i, _)| reader.d.pts[i]).collect();
    wanted_pts.dedup();
    reader.wanted = Some(wanted_pts);
    let mut scaler = Scaler {
        ctx: std::ptr::null_mut(),
        scratch: Vec::new(),
    };
    let mut i = 0;
    let mut retried = false;
    let mut last: Option<i64> = None;
    {
        let k = key_at(reader.d.pts[wanted[0].0], &reader.d);
        reader.seek(k)?;
    }
    while i < wanted.len() {
        let (index, slot) = wanted[i];
        let target = reader.d.pts[index];
        let missed = match reader.next()? {
            None => true,
            Some(p) if p < target => {
                last = Some(p);
                continue;
            }
            Some(p) if p == target => {
                last = Some(p);
                let (g, frame_bytes) = match layout {
                    Some(l) => l,
                    None => {
                        let (h, w) = (
                            reader.frame.height() as usize,
                            reader.frame.width() as usize,
                        );
                        if (h * w) as u64 > req.limits.max_pixels {
                            return Err(OpError::VideoTooLarge {
                                reason: format!(
                                    "frames of {w} x {h}, more than max_pixels ({})",
                                    req.limits.max_pixels
                                ),
                            });
                        }
                        let g = geometry(h, w, req, rng)?;
                        let (oh, ow) = g.out;
                        let frame_bytes = oh * ow * 3;
                        if total.saturating_mul(frame_bytes) > req.limits.max_bytes {
                            return Err(OpError::VideoTooLarge {
                                reason: format!(
                                    "{total} frames of {oh} x {ow} take more than max_bytes ({})",
                                    req.limits.max_bytes
                                ),
                            });
                        }
                        data = vec![0u8; total * frame_bytes];
                        layout = Some((g, frame_bytes));
                        (g, frame_bytes)
                    }
                };
                let dst = &mut data[slot * frame_bytes..(slot + 1) * frame_bytes];
                scaler.convert(&mut reader.frame, &g, dst)?;
                // The same frame at other outputs (a repeated index) is a copy.
                let mut j = i + 1;
                while j < wanted.len() && wanted[j].0 == index {
                    let other = wanted[j].1;
                    data.copy_within(
                        slot * frame_bytes..(slot + 1) * frame_bytes,
                        other * frame_bytes,
                    );
                    j += 1;
                }
                i = j;
                retried = false;
                // Seek ahead when a key frame lies between here and the next frame wanted.
                if let Some(&(next, _)) = wanted.get(i) {
                    let k = key_at(reader.d.pts[next], &reader.d);
                    if reader.d.keys[k] > p {
                        reader.seek(k)?;
                    }
                }
                continue;
            }
            Some(p) => {
                last = Some(p);
                true
            }
        };
        if missed {
            if retried {
                return Err(corrupt(format!(
                    "frame {index} (pts {target}) was not produced by the decoder{}",
                    last.map(|p| format!(" (the last frame decoded has pts {p})"))
                        .unwrap_or_default()
                )));
            }
            // A seek that landed past the frame, or a frame the decoder dropped after a
            // seek: decode from the start.
            retried = true;
            // Decode every frame this time (a packet holding two frames, as packed MPEG-4
            // B-frames do, would have hidden one).
            reader.wanted = None;
            reader.skip_nonref(false);
            reader.rewind()?;
        }
    }
    let Some((g, frame_bytes)) = layout else {
        return Err(corrupt("no frame was decoded"));
    };
    let (oh, ow) = g.out;
    let (shape, data) = if req.channels_first {
        let mut t = vec![0u8; data.len()];
        for (src, dst) in data
            .chunks_exact(frame_bytes)
            .zip(t.chunks_exact_mut(frame_bytes))
        {
            let plane = oh * ow;
            for (p, px) in src.chunks_exact(3).enumerate() {
                dst[p] = px[0];
                dst[plane + p] = px[1];
                dst[2 * plane + p] = px[2];
            }
        }
        let mut shape = lead.clone();
        shape.extend([3, oh, ow]);
        (shape, t)
    } else {
        let mut shape = lead.clone();
        shape.extend([oh, ow, 3]);
        (shape, data)
    };
    Ok(Clips {
        data,
        shape,
        pts: pts_out,
        pts_shape: lead,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(indices: Option<Vec<usize>>) -> ClipRequest {
        ClipRequest {
            sampling: Sampling {
                frames: 4,
                clips: 1,
                spacing: Spacing::Frames(1),
                sampler: Sampler::Random,
                policy: Policy::RepeatLast,
            },
            indices,
            resize: None,
            crop: None,
            crop_mode: CropMode::Center,
            channels_first: false,
            limits: VideoLimits::default(),
        }
    }

    fn video() -> Bytes {
        Bytes::from(synthetic_video(64, 48, 30, 25, 1).unwrap())
    }

    #[test]
    fn probe_counts_the_frames() {
        let info = probe(&video()).unwrap();
        assert_eq!((info.width, info.height, info.frames), (64, 48, 30));
        assert_eq!(info.fps, Some(25.0));
        assert!((info.duration - 1.2).abs() < 1e-9, "{info:?}");
    }

    #[test]
    fn any_order_of_frames_is_the_same_frames() {
        let v = video();
        let mut rng = SampleRng::for_sample(0, 0, 0);
        let all = decode_clips(&v, &request(Some((0..30).collect())), &mut rng).unwrap();
        assert_eq!(all.shape, [30, 48, 64, 3]);
        let frame = |c: &Clips, i: usize| c.data[i * 48 * 64 * 3..(i + 1) * 48 * 64 * 3].to_vec();
        // Frames differ one from the next.
        for i in 1..30 {
            assert_ne!(frame(&all, i), frame(&all, i - 1), "frame {i}");
        }
        let picks = vec![29, 3, 3, 17, 0, 12, 11];
        let some = decode_clips(&v, &request(Some(picks.clone())), &mut rng).unwrap();
        for (k, &i) in picks.iter().enumerate() {
            assert_eq!(frame(&some, k), frame(&all, i), "frame {i}");
            assert_eq!(some.pts[k], all.pts[i]);
        }
        assert!((all.pts[1] - 0.04).abs() < 1e-9, "{:?}", &all.pts[..3]);
    }

    #[test]
    fn crops_and_layouts() {
        let v = video();
        let mut req = request(None);
        req.resize = Some(Resize::Shorter(24));
        req.crop = Some((16, 16));
        let mut rng = SampleRng::for_sample(0, 0, 0);
        let c = decode_clips(&v, &req, &mut rng).unwrap();
        assert_eq!(c.shape, [4, 16, 16, 3]);
        assert_eq!(c.pts_shape, [4]);
        req.channels_first = true;
        req.sampling.clips = 3;
        let c = decode_clips(&v, &req, &mut rng).unwrap();
        assert_eq!(c.shape, [3, 4, 3, 16, 16]);
        assert_eq!(c.pts_shape, [3, 4]);
        // A crop larger than the frame is padded with zeros.
        req.resize = None;
        req.crop = Some((64, 64));
        req.sampling.clips = 1;
        req.channels_first = false;
        let c = decode_clips(&v, &req, &mut rng).unwrap();
        assert_eq!(c.shape, [4, 64, 64, 3]);
        assert!(
            c.data[..64 * 3].iter().all(|&b| b == 0),
            "the padded top row"
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let v = video();
        let mut rng = SampleRng::for_sample(0, 0, 0);
        let e = decode_clips(
            &Bytes::from_static(b"not a video at all"),
            &request(None),
            &mut rng,
        )
        .unwrap_err();
        assert!(matches!(e, OpError::NotVideo { .. }), "{e}");
        let cut = v.slice(..v.len() / 2);
        let e = decode_clips(&cut, &request(Some(vec![29])), &mut rng).unwrap_err();
        assert!(
            matches!(e, OpError::CorruptVideo { .. } | OpError::NotVideo { .. }),
            "{e}"
        );
        let mut req = request(None);
        req.limits.max_pixels = 100;
        let e = decode_clips(&v, &req, &mut rng).unwrap_err();
        assert!(matches!(e, OpError::VideoTooLarge { .. }), "{e}");
        let e = decode_clips(&v, &request(Some(vec![30])), &mut rng).unwrap_err();
        assert!(e.to_string().contains("has 30 frames"), "{e}");
    }
}
