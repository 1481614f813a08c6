//! Test support (feature `testing`): hostile images shared by the ops' tests and the
//! end-to-end tests built on them.

/// A PNG whose IHDR declares 60,000 x 60,000 RGB pixels (10.8 GB), with one byte of data: a
/// decompression bomb, refused by its header.
pub fn png_bomb() -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(60_000u32.to_be_bytes());
    ihdr.extend(60_000u32.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, adaptive filter, no interlace
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(13u32.to_be_bytes());
    png.extend(&ihdr);
    png.extend(crc32(&ihdr).to_be_bytes());
    // IDAT: a zlib stream of one stored byte (header, stored block of 1, Adler-32).
    let mut idat = b"IDAT".to_vec();
    idat.extend([
        0x78, 0x01, 0x01, 0x01, 0x00, 0xFE, 0xFF, 0x00, 0x00, 0x01, 0x00, 0x01,
    ]);
    png.extend(12u32.to_be_bytes());
    png.extend(&idat);
    png.extend(crc32(&idat).to_be_bytes());
    png.extend(0u32.to_be_bytes());
    png.extend(b"IEND");
    png.extend(crc32(b"IEND").to_be_bytes());
    png
}

/// A JPEG whose frame header declares 65,500 x 65,500 pixels: `jpeg` (any baseline JPEG)
/// with its SOF0 sizes rewritten.
pub fn jpeg_bomb(mut jpeg: Vec<u8>) -> Vec<u8> {
    let sof = jpeg
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("a baseline frame header");
    // FF C0, length (2), precision (1), height (2), width (2).
    jpeg[sof + 5..sof + 7].copy_from_slice(&65_500u16.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&65_500u16.to_be_bytes());
    jpeg
}

/// CRC-32 as PNG's chunks use it.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}
