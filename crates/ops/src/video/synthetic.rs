//! Synthetic videos encoded in memory (`chute demo --video`, tests): H.264 in MP4 through the
//! system's libx264 when FFmpeg has it, MPEG-4 part 2 (FFmpeg's own encoder) otherwise.

use std::io::{Cursor, Seek, SeekFrom, Write};
use std::sync::{Arc, Mutex};

use ff::{codec, encoder, format, frame};
use ffmpeg_next as ff;

use crate::OpError;

/// A seekable in-memory sink the muxer writes into, read back once the muxer is dropped.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Cursor<Vec<u8>>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for Sink {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).seek(pos)
    }
}

fn failed(what: &str, e: ff::Error) -> OpError {
    OpError::UnsupportedVideo {
        reason: format!("encoding a synthetic video: {what}: {e}"),
    }
}

/// An MP4 of `frames` frames of `width` x `height` (even numbers) at `fps`: a gradient that
/// moves a pixel per frame, with a band whose shade counts the frames, so each frame differs;
/// `seed` shifts the pattern. Key frames every 12 frames, B-frames where the encoder makes
/// them.
pub fn synthetic_video(
    width: u32,
    height: u32,
    frames: usize,
    fps: i32,
    seed: u64,
) -> Result<Vec<u8>, OpError> {
    super::init();
    let sink = Sink::default();
    let io = format::context::StreamIo::from_write_seek(sink.clone())
        .map_err(|e| failed("the sink", e))?;
    let mut out = format::output_to_stream(io, None, Some("mp4")).map_err(|e| failed("mp4", e))?;
    let (codec, x264) = match encoder::find_by_name("libx264") {
        Some(c) => (c, true),
        None => (
            encoder::find(codec::Id::MPEG4).ok_or_else(|| OpError::UnsupportedVideo {
                reason: "this FFmpeg has neither libx264 nor its MPEG-4 encoder".into(),
            })?,
            false,
        ),
    };
    let global = out.format().flags().contains(format::Flags::GLOBAL_HEADER);
    let mut enc = codec::context::Context::new_with_codec(codec)
        .encoder()
        .video()
        .map_err(|e| failed("the encoder", e))?;
    enc.set_width(width);
    enc.set_height(height);
    enc.set_format(format::Pixel::YUV420P);
    enc.set_frame_rate(Some((fps, 1)));
    enc.set_time_base((1, fps));
    enc.set_gop(12);
    enc.set_max_b_frames(2);
    if global {
        enc.set_flags(codec::Flags::GLOBAL_HEADER);
    }
    let mut opts = ff::Dictionary::new();
    if x264 {
        opts.set("preset", "veryfast");
        opts.set("threads", "1");
    } else {
        enc.set_bit_rate(2_000_000);
    }
    let mut enc = enc.open_with(opts).map_err(|e| failed("opening", e))?;
    let tb = {
        let mut st = out.add_stream(codec).map_err(|e| failed("the stream", e))?;
        st.set_parameters(&enc);
        st.set_time_base((1, fps));
        st.index()
    };
    out.write_header().map_err(|e| failed("the header", e))?;
    let st_tb = out.stream(tb).expect("the stream just added").time_base();
    let mut f = frame::Video::new(format::Pixel::YUV420P, width, height);
    let mut packet = ff::Packet::empty();
    let (w, h) = (width as usize, height as usize);
    let mut drain =
        |enc: &mut encoder::Video, out: &mut format::context::Output| -> Result<(), OpError> {
            while enc.receive_packet(&mut packet).is_ok() {
                packet.set_stream(tb);
                packet.set_duration(1);
                packet.rescale_ts((1, fps), st_tb);
                packet
                    .write_interleaved(out)
                    .map_err(|e| failed("muxing", e))?;
            }
            Ok(())
        };
    for t in 0..frames {
        let shift = t + seed as usize % 251;
        let stride = f.stride(0);
        let y = f.data_mut(0);
        for row in 0..h {
            for col in 0..w {
                let band = row * 8 / h.max(1) == 0;
                y[row * stride + col] = if band {
                    ((t * 37 + seed as usize) % 200 + 28) as u8
                } else {
                    ((row + col + 2 * shift) % 220 + 16) as u8
                };
            }
        }
        for plane in 1..3 {
            let stride = f.stride(plane);
            let data = f.data_mut(plane);
            for row in 0..h / 2 {
                for col in 0..w / 2 {
                    data[row * stride + col] =
                        (128 + ((col * plane + row + shift) % 64) as i32 - 32) as u8;
                }
            }
        }
        f.set_pts(Some(t as i64));
        enc.send_frame(&f).map_err(|e| failed("a frame", e))?;
        drain(&mut enc, &mut out)?;
    }
    enc.send_eof().map_err(|e| failed("the end", e))?;
    drain(&mut enc, &mut out)?;
    out.write_trailer().map_err(|e| failed("the trailer", e))?;
    drop(out);
    let bytes = sink
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_ref()
        .clone();
    Ok(bytes)
}
