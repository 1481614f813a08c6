//! The pixel types every image module shares: [`Image`] (decoded `u8` `[H, W, C]` pixels),
//! [`ColorMode`], [`Rect`] and [`ImageFormat`]. The decoders (`jpeg.rs`, `libjpeg.rs`) and
//! the ops (`image.rs`, which re-exports them) both build on them.

/// Decoded pixels: `height` rows of `width` pixels of `channels` bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Rows.
    pub height: usize,
    /// Pixels per row.
    pub width: usize,
    /// Bytes per pixel: 1 (gray) or 3 (RGB).
    pub channels: usize,
    /// `height * width * channels` bytes, row-major, channels interleaved.
    pub data: Vec<u8>,
}

/// The colour layout decoding produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColorMode {
    /// Three channels, red green blue (PIL's `convert("RGB")`). The default.
    #[default]
    Rgb,
    /// One channel of luma (PIL's `convert("L")`).
    Gray,
}

impl ColorMode {
    /// Bytes per pixel.
    pub fn channels(self) -> usize {
        match self {
            ColorMode::Rgb => 3,
            ColorMode::Gray => 1,
        }
    }
}

/// A rectangle of pixels: top row, left column, height, width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

/// The image format of encoded bytes, from their signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// JPEG (`FF D8 FF`).
    Jpeg,
    /// PNG (`89 50 4E 47 0D 0A 1A 0A`).
    Png,
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Png => "PNG",
        })
    }
}
