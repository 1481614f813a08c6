//! JPEG decoding (zune-jpeg: pure Rust, SIMD).

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use crate::image::{ColorMode, Image};

fn options(mode: ColorMode) -> DecoderOptions {
    DecoderOptions::default().jpeg_set_out_colorspace(match mode {
        ColorMode::Rgb => ColorSpace::RGB,
        ColorMode::Gray => ColorSpace::Luma,
    })
}

/// `(height, width)` from the JPEG's frame header.
pub(crate) fn size(data: &[u8]) -> Result<(usize, usize), String> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(data), options(ColorMode::Rgb));
    d.decode_headers()
        .map_err(|e| format!("not a readable JPEG: {e}"))?;
    let (w, h) = d
        .dimensions()
        .ok_or("not a readable JPEG: no frame header")?;
    Ok((h, w))
}

/// Decodes at full size (this decoder has no DCT scaling; `min_size` is a hint it ignores).
pub(crate) fn decode(
    data: &[u8],
    mode: ColorMode,
    _min_size: Option<(usize, usize)>,
) -> Result<Image, String> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(data), options(mode));
    let pixels = d
        .decode()
        .map_err(|e| format!("corrupt or truncated JPEG: {e}"))?;
    let (w, h) = d
        .dimensions()
        .ok_or("not a readable JPEG: no frame header")?;
    let channels = mode.channels();
    if pixels.len() != w * h * channels {
        return Err(format!(
            "the JPEG decoded to {} bytes for {w}x{h}x{channels}",
            pixels.len()
        ));
    }
    Ok(Image {
        height: h,
        width: w,
        channels,
        data: pixels,
    })
}
