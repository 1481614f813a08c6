//! Images as `u8` `[H, W, C]` pixels: decoding JPEG and PNG, and the geometric ops with
//! torchvision's semantics (resize of the shorter side, center crop, `RandomResizedCrop`'s
//! parameters, horizontal flip).
//!
//! Resizing is antialiased bilinear (a triangle filter widened by the scale factor when
//! shrinking, as PIL and torchvision with `antialias=True` do), through `fast_image_resize`.

use std::cell::RefCell;

use chute_core::SampleRng;
use fast_image_resize::images::{Image as FirImage, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::OpError;

pub use crate::pixels::{ColorMode, Image, ImageFormat, Rect};

/// The format of `data` from its first bytes, if it is one chute decodes.
pub fn sniff(data: &[u8]) -> Option<ImageFormat> {
    if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(ImageFormat::Jpeg)
    } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(ImageFormat::Png)
    } else {
        None
    }
}

/// A PNG decoder's error, by what went wrong.
fn png_error(e: png::DecodingError) -> OpError {
    let format = ImageFormat::Png;
    let reason = e.to_string();
    match e {
        png::DecodingError::LimitsExceeded => OpError::ImageTooLarge { format, reason },
        png::DecodingError::Parameter(_) => OpError::wrong_input("decode", reason),
        _ => OpError::CorruptImage { format, reason },
    }
}

/// The `decode` op's default `max_pixels`: PIL's `DecompressionBombError` limit (twice its
/// `MAX_IMAGE_PIXELS` warning threshold), about 13,400 x 13,400.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

/// Refuses an image whose header declares more than `max` pixels (`(height, width)` from
/// [`image_size`]): a decompression bomb would otherwise get its whole pixel buffer allocated
/// before a byte of it is read.
pub fn check_pixels(data: &[u8], (h, w): (usize, usize), max: u64) -> Result<(), OpError> {
    let n = (h as u64).saturating_mul(w as u64);
    if n <= max {
        return Ok(());
    }
    Err(OpError::ImageTooLarge {
        format: sniff(data).unwrap_or(ImageFormat::Png),
        reason: format!(
            "{} (or the decode op's own max_pixels)",
            chute_core::limits::exceeded(
                "its header",
                format!("{w} x {h} = {n}"),
                "pixels",
                "max_image_pixels",
                max
            )
        ),
    })
}

/// `(height, width)` of an encoded image, from its header alone.
pub fn image_size(data: &[u8]) -> Result<(usize, usize), OpError> {
    match sniff(data) {
        Some(ImageFormat::Jpeg) => crate::jpeg::size(data),
        Some(ImageFormat::Png) => {
            let decoder = png::Decoder::new(std::io::Cursor::new(data));
            let reader = decoder.read_info().map_err(png_error)?;
            let info = reader.info();
            Ok((info.height as usize, info.width as usize))
        }
        None => Err(OpError::not_an_image(data)),
    }
}

/// Decodes a JPEG or PNG image to `mode`'s channels.
///
/// `min_size` is the smallest `(height, width)` the caller needs: a JPEG decoder may then
/// decode at 1/2, 1/4 or 1/8 of the size (DCT scaling) where that still covers it. `None`
/// decodes at full size.
pub fn decode(
    data: &[u8],
    mode: ColorMode,
    min_size: Option<(usize, usize)>,
) -> Result<Image, OpError> {
    match sniff(data) {
        Some(ImageFormat::Jpeg) => crate::jpeg::decode(data, mode, min_size),
        Some(ImageFormat::Png) => chute_core::quiet::catch_quietly(|| decode_png(data, mode))
            .unwrap_or_else(|why| {
                Err(OpError::corrupt(
                    ImageFormat::Png,
                    format!("the decoder failed on its data ({why})"),
                ))
            }),
        None => Err(OpError::not_an_image(data)),
    }
}

fn decode_png(data: &[u8], mode: ColorMode) -> Result<Image, OpError> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(data));
    // 8 bits per channel, palettes expanded: what PIL's convert gives.
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(png_error)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| OpError::ImageTooLarge {
            format: ImageFormat::Png,
            reason: "its dimensions overflow memory".into(),
        })?;
    // A failed allocation is the image's error, not an abort (the decode op checks the
    // declared size first; this guards callers of `decode` that do not).
    let mut buf = Vec::new();
    buf.try_reserve_exact(size)
        .map_err(|_| OpError::ImageTooLarge {
            format: ImageFormat::Png,
            reason: format!("its {size}-byte pixel buffer cannot be allocated"),
        })?;
    buf.resize(size, 0);
    let frame = reader.next_frame(&mut buf).map_err(png_error)?;
    buf.truncate(frame.buffer_size());
    let (h, w) = (frame.height as usize, frame.width as usize);
    let src_channels = frame.color_type.samples();
    let pixels = buf.chunks_exact(src_channels);
    let data: Vec<u8> = match (mode, frame.color_type) {
        (ColorMode::Rgb, png::ColorType::Rgb) | (ColorMode::Gray, png::ColorType::Grayscale) => buf,
        (ColorMode::Rgb, png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha) => {
            pixels.flat_map(|p| [p[0]; 3]).collect()
        }
        (ColorMode::Rgb, _) => pixels.flat_map(|p| [p[0], p[1], p[2]]).collect(),
        (ColorMode::Gray, png::ColorType::GrayscaleAlpha) => pixels.map(|p| p[0]).collect(),
        // ITU-R 601-2 luma, as PIL's convert("L"): L = R*299/1000 + G*587/1000 + B*114/1000.
        (ColorMode::Gray, _) => pixels
            .map(|p| {
                let l = u32::from(p[0]) * 19595 + u32::from(p[1]) * 38470 + u32::from(p[2]) * 7471;
                ((l + 0x8000) >> 16) as u8
            })
            .collect(),
    };
    Ok(Image {
        height: h,
        width: w,
        channels: mode.channels(),
        data,
    })
}

impl Image {
    /// An image of zeros.
    pub fn zeros(height: usize, width: usize, channels: usize) -> Image {
        Image {
            height,
            width,
            channels,
            data: vec![0; height * width * channels],
        }
    }

    /// `rect` of this image; parts of `rect` outside the image are zero (as torchvision's
    /// `center_crop` pads). `rect.top`/`left` are relative to the image and may be negative
    /// through `offset` (rows, columns) for padding on the top and left.
    pub fn crop(&self, rect: Rect) -> Image {
        if rect.top + rect.height <= self.height && rect.left + rect.width <= self.width {
            let c = self.channels;
            let mut data = Vec::with_capacity(rect.height * rect.width * c);
            for y in rect.top..rect.top + rect.height {
                let row = (y * self.width + rect.left) * c;
                data.extend_from_slice(&self.data[row..row + rect.width * c]);
            }
            return Image {
                height: rect.height,
                width: rect.width,
                channels: c,
                data,
            };
        }
        self.padded_crop(
            rect.top as isize,
            rect.left as isize,
            rect.height,
            rect.width,
        )
    }

    /// A `height` x `width` window whose top-left corner is at (`top`, `left`), which may lie
    /// outside the image; pixels outside are zero.
    pub fn padded_crop(&self, top: isize, left: isize, height: usize, width: usize) -> Image {
        let c = self.channels;
        let mut out = Image::zeros(height, width, c);
        for y in 0..height {
            let sy = top + y as isize;
            if sy < 0 || sy >= self.height as isize {
                continue;
            }
            let x0 = left.max(0);
            let x1 = (left + width as isize).min(self.width as isize);
            if x0 >= x1 {
                continue;
            }
            let n = (x1 - x0) as usize * c;
            let src = (sy as usize * self.width + x0 as usize) * c;
            let dst = (y * width + (x0 - left) as usize) * c;
            out.data[dst..dst + n].copy_from_slice(&self.data[src..src + n]);
        }
        out
    }

    /// Mirrors left to right, in place.
    pub fn flip_horizontal(&mut self) {
        flip_horizontal(&mut self.data, self.width, self.channels);
    }

    /// The pixels of `crop` (the whole image if `None`) resized to `height` x `width`, with
    /// antialiased bilinear filtering.
    pub fn resize(
        &self,
        crop: Option<Rect>,
        height: usize,
        width: usize,
    ) -> Result<Image, OpError> {
        let mut data = vec![0; height * width * self.channels];
        self.resize_into(crop, height, width, &mut data)?;
        Ok(Image {
            height,
            width,
            channels: self.channels,
            data,
        })
    }

    /// [`Image::resize`] into `dst` (`height * width * channels` bytes, e.g. a sample's slot
    /// of a batch buffer).
    pub fn resize_into(
        &self,
        crop: Option<Rect>,
        height: usize,
        width: usize,
        dst: &mut [u8],
    ) -> Result<(), OpError> {
        let crop = crop.unwrap_or(Rect {
            top: 0,
            left: 0,
            height: self.height,
            width: self.width,
        });
        if crop.height == height
            && crop.width == width
            && crop.top + crop.height <= self.height
            && crop.left + crop.width <= self.width
        {
            let row = width * self.channels;
            for (y, out) in dst.chunks_exact_mut(row).take(height).enumerate() {
                let at = ((crop.top + y) * self.width + crop.left) * self.channels;
                out.copy_from_slice(&self.data[at..at + row]);
            }
            return Ok(());
        }
        self.resize_f_into(
            [
                crop.top as f64,
                crop.left as f64,
                crop.height as f64,
                crop.width as f64,
            ],
            height,
            width,
            dst,
        )
    }

    /// The region `[top, left, height, width]` (in pixels, fractions allowed) resized to
    /// `height` x `width`, with antialiased bilinear filtering.
    pub fn resize_f(&self, crop: [f64; 4], height: usize, width: usize) -> Result<Image, OpError> {
        let mut data = vec![0; height * width * self.channels];
        self.resize_f_into(crop, height, width, &mut data)?;
        Ok(Image {
            height,
            width,
            channels: self.channels,
            data,
        })
    }

    /// [`Image::resize_f`] into `dst` (`height * width * channels` bytes).
    pub fn resize_f_into(
        &self,
        crop: [f64; 4],
        height: usize,
        width: usize,
        dst: &mut [u8],
    ) -> Result<(), OpError> {
        let [top, left, ch, cw] = crop;
        if height == 0 || width == 0 || !(ch > 0.0 && cw > 0.0) {
            return Err(OpError::wrong_input(
                "resize",
                format!("a {ch}x{cw} region cannot be resized to {height}x{width}"),
            ));
        }
        let pixel = match self.channels {
            1 => PixelType::U8,
            2 => PixelType::U8x2,
            3 => PixelType::U8x3,
            4 => PixelType::U8x4,
            c => {
                return Err(OpError::wrong_input(
                    "resize",
                    format!("an image of {c} channels (1 to 4 are supported)"),
                ));
            }
        };
        let src = ImageRef::new(self.width as u32, self.height as u32, &self.data, pixel)
            .map_err(|e| OpError::wrong_input("resize", e.to_string()))?;
        let mut out = FirImage::from_slice_u8(width as u32, height as u32, dst, pixel)
            .map_err(|e| OpError::wrong_input("resize", e.to_string()))?;
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .crop(left, top, cw, ch);
        RESIZER
            .with(|r| r.borrow_mut().resize(&src, &mut out, &options))
            .map_err(|e| OpError::wrong_input("resize", e.to_string()))
    }
}

/// Mirrors rows of `width` pixels of `channels` bytes left to right, in place.
pub fn flip_horizontal(data: &mut [u8], width: usize, channels: usize) {
    let c = channels;
    for row in data.chunks_exact_mut((width * c).max(1)) {
        let (mut a, mut b) = (0, width.saturating_sub(1));
        while a < b {
            for k in 0..c {
                row.swap(a * c + k, b * c + k);
            }
            a += 1;
            b -= 1;
        }
    }
}

thread_local! {
    /// One resizer per worker thread: it keeps its scratch buffers between images.
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Python's `round`: halves to even.
fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// torchvision's `Resize(size)` output for an `h` x `w` image: the shorter side becomes
/// `size` and the longer keeps the aspect ratio (truncated), capped by `max_size` if given.
pub fn resize_shorter(h: usize, w: usize, size: usize, max_size: Option<usize>) -> (usize, usize) {
    let (short, long) = if w <= h { (w, h) } else { (h, w) };
    let (mut new_short, mut new_long) = (size, (size as f64 * long as f64 / short as f64) as usize);
    if let Some(max) = max_size
        && new_long > max
    {
        new_short = (max as f64 * new_short as f64 / new_long as f64) as usize;
        new_long = max;
    }
    let (new_short, new_long) = (new_short.max(1), new_long.max(1));
    if w <= h {
        (new_long, new_short)
    } else {
        (new_short, new_long)
    }
}

/// torchvision's `center_crop` placement: top and left offsets (negative means padding).
pub fn center_crop_offsets(h: usize, w: usize, ch: usize, cw: usize) -> (isize, isize) {
    let top = round_half_even((h as f64 - ch as f64) / 2.0) as isize;
    let left = round_half_even((w as f64 - cw as f64) / 2.0) as isize;
    (top, left)
}

/// torchvision's `RandomResizedCrop.get_params` for an `h` x `w` image: up to 10 tries of a
/// random area fraction in `scale` and log-uniform aspect ratio in `ratio`; then the fallback,
/// a central crop with the aspect ratio clamped to `ratio`.
pub fn random_resized_crop_params(
    h: usize,
    w: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut SampleRng,
) -> Rect {
    let area = (h * w) as f64;
    let (log_lo, log_hi) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale[0], scale[1]);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let cw = round_half_even((target_area * aspect).sqrt()) as usize;
        let ch = round_half_even((target_area / aspect).sqrt()) as usize;
        if 0 < cw && cw <= w && 0 < ch && ch <= h {
            let top = rng.below((h - ch + 1) as u64) as usize;
            let left = rng.below((w - cw + 1) as u64) as usize;
            return Rect {
                top,
                left,
                height: ch,
                width: cw,
            };
        }
    }
    let in_ratio = w as f64 / h as f64;
    let (lo, hi) = (ratio[0].min(ratio[1]), ratio[0].max(ratio[1]));
    let (ch, cw) = if in_ratio < lo {
        (round_half_even(w as f64 / lo) as usize, w)
    } else if in_ratio > hi {
        (h, round_half_even(h as f64 * hi) as usize)
    } else {
        (h, w)
    };
    let (ch, cw) = (ch.clamp(1, h.max(1)), cw.clamp(1, w.max(1)));
    Rect {
        top: (h - ch) / 2,
        left: (w - cw) / 2,
        height: ch,
        width: cw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(h: usize, w: usize, c: usize) -> Image {
        Image {
            height: h,
            width: w,
            channels: c,
            data: (0..h * w * c).map(|i| (i % 251) as u8).collect(),
        }
    }

    #[test]
    fn resize_shorter_matches_torchvision() {
        // torchvision.transforms.Resize(256) on (h, w) images.
        assert_eq!(resize_shorter(375, 500, 256, None), (256, 341));
        assert_eq!(resize_shorter(500, 375, 256, None), (341, 256));
        assert_eq!(resize_shorter(300, 300, 224, None), (224, 224));
        assert_eq!(resize_shorter(100, 1000, 50, Some(200)), (20, 200));
    }

    #[test]
    fn center_crop_pads_and_rounds_like_torchvision() {
        assert_eq!(center_crop_offsets(256, 341, 224, 224), (16, 58));
        assert_eq!(center_crop_offsets(255, 255, 224, 224), (16, 16)); // 15.5 -> 16
        assert_eq!(center_crop_offsets(100, 100, 224, 224), (-62, -62));
        let img = ramp(4, 4, 1);
        let out = img.padded_crop(-1, -1, 6, 6);
        assert_eq!(out.data[0], 0);
        assert_eq!(out.data[7], img.data[0]);
        assert_eq!(
            img.crop(Rect {
                top: 1,
                left: 1,
                height: 2,
                width: 2
            })
            .data,
            [5, 6, 9, 10]
        );
    }

    #[test]
    fn random_resized_crop_stays_inside_and_falls_back_to_the_center() {
        let mut rng = SampleRng::for_sample(1, 0, 0);
        for _ in 0..1000 {
            let r = random_resized_crop_params(300, 500, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
            assert!(r.top + r.height <= 300 && r.left + r.width <= 500, "{r:?}");
            assert!(r.height > 0 && r.width > 0);
        }
        // A scale no try can meet: the fallback clamps the aspect ratio, centred.
        let r = random_resized_crop_params(100, 1000, [2.0, 2.0], [0.75, 4.0 / 3.0], &mut rng);
        assert_eq!((r.height, r.width), (100, 133));
        assert_eq!((r.top, r.left), (0, (1000 - 133) / 2));
    }

    #[test]
    fn flip_and_resize() {
        let mut img = ramp(2, 3, 3);
        let orig = img.clone();
        img.flip_horizontal();
        assert_eq!(&img.data[0..3], &orig.data[6..9]);
        img.flip_horizontal();
        assert_eq!(img, orig);
        let flat = Image {
            height: 64,
            width: 48,
            channels: 3,
            data: vec![77; 64 * 48 * 3],
        };
        let small = flat.resize(None, 16, 12).unwrap();
        assert_eq!(
            (small.height, small.width, small.data.len()),
            (16, 12, 16 * 12 * 3)
        );
        assert!(
            small.data.iter().all(|&v| v == 77),
            "a flat image stays flat"
        );
        let part = flat
            .resize(
                Some(Rect {
                    top: 10,
                    left: 5,
                    height: 20,
                    width: 20,
                }),
                7,
                7,
            )
            .unwrap();
        assert_eq!(part.data.len(), 7 * 7 * 3);
    }

    #[test]
    fn bad_bytes_are_named() {
        let e = decode(b"GIF89a....", ColorMode::Rgb, None).unwrap_err();
        assert!(matches!(e, OpError::NotAnImage { len: 10, .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("not a JPEG or PNG") && e.contains("47 49 46"),
            "{e}"
        );
        let e = decode(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 16], ColorMode::Rgb, None).unwrap_err();
        assert!(
            matches!(
                e,
                OpError::CorruptImage {
                    format: ImageFormat::Jpeg,
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
