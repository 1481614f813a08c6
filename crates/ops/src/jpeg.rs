//! JPEG decoding: zune-jpeg (pure Rust, SIMD) for full-size decodes, libjpeg-turbo's decoder
//! (feature `libjpeg`, on by default; see [`crate::libjpeg`]) for reduced-size and region
//! decodes, and for everything when it was built with its SIMD kernels (it is then the faster
//! of the two, and gives PIL's pixels).

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;
use zune_jpeg::errors::DecodeErrors;

use crate::OpError;
use crate::pixels::{ColorMode, Image, ImageFormat, Rect};

/// zune-jpeg's options: any size a JPEG can declare (65,535 a side) is read, so that the
/// `decode` op's own pixel limit is what refuses a large one, with its message.
fn options(mode: ColorMode) -> DecoderOptions {
    DecoderOptions::default()
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .jpeg_set_out_colorspace(match mode {
            ColorMode::Rgb => ColorSpace::RGB,
            ColorMode::Gray => ColorSpace::Luma,
        })
}

/// zune-jpeg's error, by what went wrong.
fn zune_error(e: DecodeErrors) -> OpError {
    let format = ImageFormat::Jpeg;
    let reason = e.to_string();
    match e {
        DecodeErrors::Unsupported(_) => OpError::UnsupportedImage { format, reason },
        DecodeErrors::LargeDimensions(_) => OpError::ImageTooLarge { format, reason },
        _ => OpError::CorruptImage { format, reason },
    }
}

fn no_frame_header() -> OpError {
    OpError::corrupt(ImageFormat::Jpeg, "no frame header")
}

/// `(height, width)` from the JPEG's frame header.
pub(crate) fn size(data: &[u8]) -> Result<(usize, usize), OpError> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(data), options(ColorMode::Rgb));
    d.decode_headers().map_err(zune_error)?;
    let (w, h) = d.dimensions().ok_or_else(no_frame_header)?;
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

/// Refuses a JPEG cut short, as PIL does (decoders would fill in grey).
fn check_complete(data: &[u8]) -> Result<(), OpError> {
    if is_complete(data) {
        return Ok(());
    }
    Err(OpError::corrupt(
        ImageFormat::Jpeg,
        format!(
            "no end-of-image marker after the last scan ({} bytes; the file was cut short)",
            data.len()
        ),
    ))
}

/// The largest DCT scaling denominator (8, 4, 2 or 1) that keeps `have` at least `need` pixels
/// in both dimensions.
pub(crate) fn scale_denom(have: (usize, usize), need: (usize, usize)) -> u32 {
    [8, 4, 2]
        .into_iter()
        .find(|&d| have.0 >= need.0 * d && have.1 >= need.1 * d)
        .map_or(1, |d| d as u32)
}

/// Decodes the whole picture. `min_size` is the smallest `(height, width)` the caller needs:
/// with libjpeg the picture is then decoded at 1/2, 1/4 or 1/8 of its size where that still
/// covers it.
pub(crate) fn decode(
    data: &[u8],
    mode: ColorMode,
    min_size: Option<(usize, usize)>,
) -> Result<Image, OpError> {
    check_complete(data)?;
    #[cfg(feature = "libjpeg")]
    if crate::libjpeg::handles(data) {
        let denom = match min_size {
            Some(need) => scale_denom(size(data)?, need),
            None => 1,
        };
        if denom > 1 || crate::libjpeg::has_simd() {
            return crate::libjpeg::decode(data, mode, denom, None).map(|d| d.image);
        }
    }
    #[cfg(not(feature = "libjpeg"))]
    let _ = min_size;
    decode_zune(data, mode)
}

/// Decodes what the region `crop` of an `h` x `w` JPEG needs to be resized to `out`: the
/// picture at the smallest DCT scale that keeps the crop at least `out`, and only the crop's
/// rows and (iMCU-aligned) columns. Returns the pixels and the crop's `[top, left, height,
/// width]` within them (fractional after scaling). `None` when this build cannot do better
/// than a full decode (no libjpeg, a CMYK JPEG, or libjpeg without SIMD at full scale).
pub(crate) fn decode_crop(
    data: &[u8],
    mode: ColorMode,
    (h, w): (usize, usize),
    crop: Rect,
    out: (usize, usize),
) -> Result<Option<(Image, [f64; 4])>, OpError> {
    #[cfg(feature = "libjpeg")]
    {
        check_complete(data)?;
        if !crate::libjpeg::handles(data) {
            return Ok(None);
        }
        let d = scale_denom((crop.height, crop.width), out);
        if d == 1 && !crate::libjpeg::has_simd() {
            return Ok(None);
        }
        let du = d as usize;
        let (sh, sw) = (h.div_ceil(du), w.div_ceil(du));
        let top = crop.top / du;
        let left = crop.left / du;
        let bottom = (crop.top + crop.height).div_ceil(du).min(sh);
        let right = (crop.left + crop.width).div_ceil(du).min(sw);
        let region = Rect {
            top,
            left,
            height: bottom - top,
            width: right - left,
        };
        let region = (region.height < sh || region.width < sw).then_some(region);
        let got = crate::libjpeg::decode(data, mode, d, region)?;
        let f = f64::from(d);
        let at = [
            crop.top as f64 / f - got.top as f64,
            crop.left as f64 / f - got.left as f64,
            crop.height as f64 / f,
            crop.width as f64 / f,
        ];
        Ok(Some((got.image, at)))
    }
    #[cfg(not(feature = "libjpeg"))]
    {
        let _ = (data, mode, (h, w), crop, out);
        Ok(None)
    }
}

/// Full-size decode with zune-jpeg.
fn decode_zune(data: &[u8], mode: ColorMode) -> Result<Image, OpError> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(data), options(mode));
    // zune-jpeg panics on some corrupt scans (found by the image_ops fuzz target: an
    // unwrap in its AVX2 IDCT): a bad file, not a crash.
    let pixels = chute_core::quiet::catch_quietly(|| d.decode())
        .map_err(|why| {
            OpError::corrupt(
                ImageFormat::Jpeg,
                format!("the decoder failed on its data ({why})"),
            )
        })?
        .map_err(zune_error)?;
    let (w, h) = d.dimensions().ok_or_else(no_frame_header)?;
    let channels = mode.channels();
    if pixels.len() != w * h * channels {
        return Err(OpError::corrupt(
            ImageFormat::Jpeg,
            format!("decoded to {} bytes for {w}x{h}x{channels}", pixels.len()),
        ));
    }
    Ok(Image {
        height: h,
        width: w,
        channels,
        data: pixels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image_ops fuzz target's first crash (2026-12-02, minimized): a JPEG on which
    /// zune-jpeg's AVX2 IDCT unwraps `None`. A corrupt-image error, never a panic.
    #[test]
    fn a_scan_that_panics_zune_is_a_corrupt_image() {
        let data = include_bytes!("../testdata/zune-idct-panic.jpg");
        let e = decode_zune(data, ColorMode::Rgb).unwrap_err();
        assert!(matches!(e, OpError::CorruptImage { .. }), "{e}");
        assert!(crate::image::decode(data, ColorMode::Rgb, None).is_err());
    }
}
