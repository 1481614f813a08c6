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

/// Whether the last scan of `data` is followed by an end-of-image marker. Inside entropy-coded
/// data a `0xFF` is always followed by `0x00` or a restart marker, so `FF D9` (end of image)
/// and `FF DA` (start of scan) appear there only as markers; a thumbnail's EOI comes before
/// the main image's scans. A JPEG cut short has no EOI after its last scan.
pub(crate) fn is_complete(data: &[u8]) -> bool {
    let is_marker = |w: &[u8], m: u8| w[0] == 0xFF && w[1] == m;
    match data.windows(2).rposition(|w| is_marker(w, 0xD9)) {
        Some(eoi) => !data[eoi..].windows(2).any(|w| is_marker(w, 0xDA)),
        None => false,
    }
}

/// Decodes at full size (this decoder has no DCT scaling; `min_size` is a hint it ignores).
/// A JPEG cut short is an error, as in PIL (the decoder itself would fill in grey).
pub(crate) fn decode(
    data: &[u8],
    mode: ColorMode,
    _min_size: Option<(usize, usize)>,
) -> Result<Image, String> {
    if !is_complete(data) {
        return Err(format!(
            "truncated JPEG: no end-of-image marker after the last scan ({} bytes; the file was \
             cut short)",
            data.len()
        ));
    }
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
