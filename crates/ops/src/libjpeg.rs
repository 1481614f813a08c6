//! JPEG decoding with libjpeg-turbo's decoder, as vendored by `mozjpeg-sys` (MozJPEG 4 keeps
//! libjpeg-turbo's decoder unchanged). It is built from source with the C compiler, with its
//! SIMD kernels when `nasm` is installed at build time and without them otherwise.
//!
//! What it adds over zune-jpeg: **DCT scaling** (decode straight to 1/2, 1/4 or 1/8 of the size,
//! skipping most of the inverse DCT and colour conversion) and **region decoding** (the rows
//! above a crop are only entropy-decoded, the rows below are never touched, and columns outside
//! it skip the inverse DCT). Its pixels are the ones PIL produces, since PIL decodes with
//! libjpeg-turbo too.
//!
//! libjpeg reports fatal errors through a callback that must not return; ours unwinds (the
//! library is compiled with `-fexceptions`, and the callbacks are `extern "C-unwind"`) with a
//! private payload that [`decode`] catches, so corrupt data is an `Err`, never an abort, and
//! the decompressor is destroyed on every path.

use std::ffi::{c_int, c_ulong};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use mozjpeg_sys as ffi;

use crate::OpError;
use crate::pixels::{ColorMode, Image, ImageFormat, Rect};

/// A decoded region: `image` starts at `(top, left)` of the scaled picture (the left edge is
/// moved left to an iMCU column boundary, as libjpeg requires).
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) image: Image,
    pub(crate) top: usize,
    pub(crate) left: usize,
}

/// The panic payload of a libjpeg error: the library's message code and its text.
struct LibjpegError {
    code: c_int,
    message: String,
}

impl LibjpegError {
    /// The error by what went wrong, told by libjpeg's message code (`jerror.h`).
    fn into_op_error(self) -> OpError {
        let format = ImageFormat::Jpeg;
        let reason = self.message;
        let code: ffi::J_MESSAGE_CODE = self.code;
        match code {
            ffi::JERR_ARITH_NOTIMPL
            | ffi::JERR_BAD_PRECISION
            | ffi::JERR_CCIR601_NOTIMPL
            | ffi::JERR_CONVERSION_NOTIMPL
            | ffi::JERR_FRACT_SAMPLE_NOTIMPL
            | ffi::JERR_NOTIMPL
            | ffi::JERR_NOT_COMPILED
            | ffi::JERR_SOF_UNSUPPORTED => OpError::UnsupportedImage { format, reason },
            ffi::JERR_IMAGE_TOO_BIG | ffi::JERR_WIDTH_OVERFLOW => {
                OpError::ImageTooLarge { format, reason }
            }
            _ => OpError::CorruptImage { format, reason },
        }
    }
}

/// Whether the library was built with its SIMD kernels (it was built with `nasm` available):
/// without them zune-jpeg decodes full-size images faster, so it keeps that job.
pub(crate) fn has_simd() -> bool {
    unsafe extern "C" {
        /// libjpeg-turbo's SIMD dispatch; `jsimd_none.c` (no SIMD) answers 0.
        fn jsimd_can_idct_islow() -> c_int;
    }
    // SAFETY: a query without arguments or side effects beyond libjpeg-turbo's one-time CPU
    // feature detection, which is thread-safe.
    unsafe { jsimd_can_idct_islow() != 0 }
}

/// Whether libjpeg can decode this JPEG to RGB or grayscale itself: not CMYK/YCCK (PIL
/// converts those in Python; zune-jpeg does it for us).
pub(crate) fn handles(data: &[u8]) -> bool {
    // SOF marker: the component count is at offset 9 of the segment.
    let mut i = 2;
    while i + 9 < data.len() {
        if data[i] != 0xFF {
            return false;
        }
        let marker = data[i + 1];
        if marker == 0xFF {
            i += 1;
            continue;
        }
        let len = usize::from(u16::from_be_bytes([data[i + 2], data[i + 3]]));
        if matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) {
            return matches!(data[i + 9], 1 | 3);
        }
        i += 2 + len;
    }
    false
}

/// Decodes `data` at `1/denom` of its size (`denom` in 1, 2, 4, 8), only the rows and columns
/// of `region` (given in scaled pixels; the whole picture if `None`).
pub(crate) fn decode(
    data: &[u8],
    mode: ColorMode,
    denom: u32,
    region: Option<Rect>,
) -> Result<Decoded, OpError> {
    match catch_unwind(AssertUnwindSafe(|| {
        decode_unwinding(data, mode, denom, region)
    })) {
        Ok(result) => result,
        Err(payload) => match payload.downcast::<LibjpegError>() {
            Ok(e) => Err(e.into_op_error()),
            Err(other) => resume_unwind(other),
        },
    }
}

/// A decompressor and its error manager, boxed together so the pointer between them stays
/// valid; destroyed on drop, also while unwinding out of a libjpeg error.
struct Decompressor {
    cinfo: ffi::jpeg_decompress_struct,
    err: ffi::jpeg_error_mgr,
}

impl Decompressor {
    fn new() -> Box<Decompressor> {
        // SAFETY: both structs are plain C data for which all-zero is the documented starting
        // state (libjpeg's examples `memset` them); the pointer from `cinfo` to `err` is set
        // after boxing, so it stays valid as long as the box lives, and `jpeg_create_decompress`
        // initialises the rest. A failure inside it unwinds through `error_exit` before
        // anything was allocated.
        unsafe {
            let mut d: Box<Decompressor> = Box::new(MaybeUninit::zeroed().assume_init());
            ffi::jpeg_std_error(&mut d.err);
            d.err.error_exit = Some(error_exit);
            d.err.emit_message = Some(emit_message);
            d.cinfo.common.err = &mut d.err;
            ffi::jpeg_create_decompress(&mut d.cinfo);
            d
        }
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: `cinfo` was created by `jpeg_create_decompress`; destroying frees its memory
        // pools whatever state a decode stopped in.
        unsafe { ffi::jpeg_destroy_decompress(&mut self.cinfo) }
    }
}

fn decode_unwinding(
    data: &[u8],
    mode: ColorMode,
    denom: u32,
    region: Option<Rect>,
) -> Result<Decoded, OpError> {
    if !matches!(denom, 1 | 2 | 4 | 8) {
        return Err(OpError::wrong_input(
            "decode",
            format!("JPEG scaling 1/{denom} is not one of 1, 1/2, 1/4, 1/8"),
        ));
    }
    let mut d = Decompressor::new();
    let cinfo = &mut d.cinfo;
    // SAFETY: the calls follow libjpeg's documented sequence on a created decompressor. The
    // source is `data`, which outlives the decompressor (dropped at the end of this function).
    // Row pointers point into `pixels`, sized for `rows` rows of `stride` bytes before the
    // first read, and libjpeg writes at most `output_width * channels` bytes per row.
    // Errors unwind out of these calls into `decode`'s `catch_unwind`.
    unsafe {
        ffi::jpeg_mem_src(cinfo, data.as_ptr(), data.len() as c_ulong);
        ffi::jpeg_read_header(cinfo, 1);
        cinfo.out_color_space = match mode {
            ColorMode::Rgb => ffi::J_COLOR_SPACE::JCS_RGB,
            ColorMode::Gray => ffi::J_COLOR_SPACE::JCS_GRAYSCALE,
        };
        cinfo.scale_num = 1;
        cinfo.scale_denom = denom;
        ffi::jpeg_start_decompress(cinfo);
        let (full_w, full_h) = (cinfo.output_width as usize, cinfo.output_height as usize);
        let r = region.unwrap_or(Rect {
            top: 0,
            left: 0,
            height: full_h,
            width: full_w,
        });
        if r.height == 0 || r.width == 0 || r.top + r.height > full_h || r.left + r.width > full_w {
            return Err(OpError::wrong_input(
                "decode",
                format!(
                    "region {}x{} at ({}, {}) is outside the {full_h}x{full_w} JPEG",
                    r.height, r.width, r.top, r.left
                ),
            ));
        }
        let (mut left, mut width) = (r.left as ffi::JDIMENSION, r.width as ffi::JDIMENSION);
        if r.left != 0 || r.width != full_w {
            ffi::jpeg_crop_scanline(cinfo, &mut left, &mut width);
        }
        if r.top > 0 {
            let skipped = ffi::jpeg_skip_scanlines(cinfo, r.top as ffi::JDIMENSION);
            if skipped as usize != r.top {
                return Err(OpError::corrupt(
                    ImageFormat::Jpeg,
                    format!("could skip only {skipped} of {} rows", r.top),
                ));
            }
        }
        let channels = mode.channels();
        let stride = width as usize * channels;
        let rows = r.height;
        let mut pixels = vec![0u8; stride * rows];
        let mut row_ptrs: Vec<*mut u8> = pixels
            .chunks_exact_mut(stride)
            .map(<[u8]>::as_mut_ptr)
            .collect();
        let mut done = 0;
        while done < rows {
            let n = ffi::jpeg_read_scanlines(
                cinfo,
                row_ptrs[done..].as_mut_ptr(),
                (rows - done) as ffi::JDIMENSION,
            ) as usize;
            if n == 0 {
                return Err(OpError::corrupt(
                    ImageFormat::Jpeg,
                    format!("the data ended after {done} of {rows} rows"),
                ));
            }
            done += n;
        }
        // Rows below the region are never decoded; `Drop` releases the decompressor.
        ffi::jpeg_abort_decompress(cinfo);
        Ok(Decoded {
            image: Image {
                height: rows,
                width: width as usize,
                channels,
                data: pixels,
            },
            top: r.top,
            left: left as usize,
        })
    }
}

/// libjpeg's message code and text for the error or warning in `cinfo`.
fn error(cinfo: &mut ffi::jpeg_common_struct) -> LibjpegError {
    // SAFETY: `err` points at our error manager (set in `Decompressor::new`).
    let code = unsafe { (*cinfo.err).msg_code };
    LibjpegError {
        code,
        message: message(cinfo),
    }
}

/// libjpeg's message for the error or warning in `cinfo`.
fn message(cinfo: &mut ffi::jpeg_common_struct) -> String {
    // SAFETY: `err` points at our error manager (set in `Decompressor::new`); `format_message`
    // writes a NUL-terminated string of at most 80 bytes (JMSG_LENGTH_MAX) into the buffer.
    unsafe {
        let Some(format) = (*cinfo.err).format_message else {
            return format!("libjpeg error {}", (*cinfo.err).msg_code);
        };
        let buffer = [0u8; 80];
        format(cinfo, &buffer);
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    }
}

/// Fatal errors: unwind to [`decode`] (no panic hook runs, nothing is printed).
extern "C-unwind" fn error_exit(cinfo: &mut ffi::jpeg_common_struct) {
    resume_unwind(Box::new(error(cinfo)));
}

/// Warnings (level -1) are corrupt data that libjpeg would paper over with grey: an error here,
/// as PIL reports a truncated file. Stray bytes between markers are the exception (common in
/// real datasets and harmless to the pixels), as are trace messages (levels >= 0).
extern "C-unwind" fn emit_message(cinfo: &mut ffi::jpeg_common_struct, level: c_int) {
    if level >= 0 {
        return;
    }
    let e = error(cinfo);
    if e.code == ffi::JWRN_EXTRANEOUS_DATA {
        return;
    }
    resume_unwind(Box::new(e));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::jpeg;

    fn mean_diff(a: &[u8], b: &[u8]) -> f64 {
        assert_eq!(a.len(), b.len());
        let sum: u64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| u64::from(x.abs_diff(*y)))
            .sum();
        sum as f64 / a.len() as f64
    }

    #[test]
    fn a_region_is_the_full_decode_cropped() {
        let data = jpeg(96, 128);
        let full = decode(&data, ColorMode::Rgb, 1, None).unwrap();
        assert_eq!(
            (full.image.height, full.image.width, full.top, full.left),
            (96, 128, 0, 0)
        );
        let region = Rect {
            top: 21,
            left: 37,
            height: 40,
            width: 50,
        };
        let got = decode(&data, ColorMode::Rgb, 1, Some(region)).unwrap();
        // Rows start where asked; columns at the iMCU boundary at or before the crop.
        assert_eq!(got.top, 21);
        assert!(
            got.left <= 37 && got.left.is_multiple_of(8),
            "left {}",
            got.left
        );
        assert!(got.left + got.image.width >= 37 + 50);
        let want = full.image.crop(Rect {
            top: got.top,
            left: got.left,
            height: got.image.height,
            width: got.image.width,
        });
        // Identical but for chroma upsampling at the region's edges.
        assert!(mean_diff(&got.image.data, &want.data) < 0.2);
    }

    #[test]
    fn scaled_decodes_are_the_picture_at_a_fraction_of_the_size() {
        let data = jpeg(256, 192);
        let full = decode(&data, ColorMode::Rgb, 1, None).unwrap().image;
        for denom in [2, 4, 8] {
            let d = denom as usize;
            let got = decode(&data, ColorMode::Gray, denom, None).unwrap().image;
            assert_eq!((got.height, got.width, got.channels), (256 / d, 192 / d, 1));
            let got = decode(&data, ColorMode::Rgb, denom, None).unwrap().image;
            assert_eq!((got.height, got.width), (256 / d, 192 / d));
            let want = full.resize(None, 256 / d, 192 / d).unwrap();
            let m = mean_diff(&got.data, &want.data);
            assert!(
                m < 3.0,
                "1/{denom}: mean difference {m} from full decode + resize"
            );
        }
        assert!(decode(&data, ColorMode::Rgb, 3, None).is_err());
    }

    #[test]
    fn progressive_jpegs_decode_scaled_and_by_region() {
        let mut px = Vec::new();
        for y in 0..80u32 {
            for x in 0..120u32 {
                px.extend([(x * 2) as u8, (y * 3) as u8, ((x + y) % 256) as u8]);
            }
        }
        let mut data = Vec::new();
        let mut enc = jpeg_encoder::Encoder::new(&mut data, 85);
        enc.set_progressive(true);
        enc.encode(&px, 120, 80, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        let full = decode(&data, ColorMode::Rgb, 1, None).unwrap().image;
        assert_eq!((full.height, full.width), (80, 120));
        let m = mean_diff(&full.data, &px);
        assert!(m < 3.0, "progressive decode differs from the source by {m}");
        let region = Rect {
            top: 10,
            left: 20,
            height: 20,
            width: 30,
        };
        let got = decode(&data, ColorMode::Rgb, 2, Some(region)).unwrap();
        assert_eq!((got.top, got.image.height), (10, 20));
        assert!(got.left <= 20 && got.left + got.image.width >= 50);
    }

    #[test]
    fn corrupt_data_is_an_error_not_an_abort() {
        let data = jpeg(64, 64);
        // Garbage in the entropy-coded data after the last header.
        let sos = data.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
        let mut bad = data.clone();
        for b in &mut bad[sos + 20..data.len() - 2] {
            *b = 0xFF;
        }
        let e = decode(&bad, ColorMode::Rgb, 1, None).unwrap_err();
        assert!(e.to_string().contains("corrupt"), "{e}");
        // No frame header at all.
        let e = decode(&data[..20], ColorMode::Rgb, 2, None).unwrap_err();
        assert!(matches!(e, OpError::CorruptImage { .. }), "{e:?}");
        assert!(e.to_string().contains("corrupt or truncated JPEG"), "{e}");
        // A region outside the picture.
        let outside = Rect {
            top: 60,
            left: 0,
            height: 10,
            width: 10,
        };
        assert!(decode(&data, ColorMode::Rgb, 1, Some(outside)).is_err());
        // The decoder still works afterwards on this thread.
        assert!(decode(&data, ColorMode::Rgb, 1, None).is_ok());
    }

    #[test]
    fn cmyk_is_left_to_zune() {
        let mut out = Vec::new();
        let px = vec![40u8; 16 * 16 * 4];
        jpeg_encoder::Encoder::new(&mut out, 90)
            .encode(&px, 16, 16, jpeg_encoder::ColorType::Cmyk)
            .unwrap();
        assert!(!handles(&out));
        assert!(handles(&jpeg(16, 16)));
        let img = crate::image::decode(&out, ColorMode::Rgb, Some((4, 4))).unwrap();
        assert_eq!((img.height, img.width, img.channels), (16, 16, 3));
    }
}
