//! The one thing chute reads of a Matroska/WebM file itself: the `DiscardPadding` of the audio
//! track's blocks (how much of a block's decoded audio is encoder padding, written on an Opus
//! stream's last block), which FFmpeg trims and Symphonia's Matroska reader does not. A
//! bounded walk over the EBML elements (Segment, Cluster, BlockGroup): every size is checked
//! against the bytes that hold it, and elements of unknown size extend to their parent's end.

const SEGMENT: u32 = 0x1853_8067;
const CLUSTER: u32 = 0x1F43_B675;
const BLOCK_GROUP: u32 = 0xA0;
const BLOCK: u32 = 0xA1;
const DISCARD_PADDING: u32 = 0x75A2;

/// A variable-length integer at the start of `b`: its value (with the length marker kept
/// for IDs, removed for sizes; `None` for an unknown size) and its length.
fn vint(b: &[u8], keep_marker: bool) -> Option<(Option<u64>, usize)> {
    let first = *b.first()?;
    let len = first.leading_zeros() as usize + 1;
    if len > 8 {
        return None;
    }
    let bytes = b.get(..len)?;
    let mut v = if keep_marker {
        u64::from(first)
    } else {
        u64::from(first) & ((1u64 << (8 - len)) - 1)
    };
    for &x in &bytes[1..] {
        v = (v << 8) | u64::from(x);
    }
    let unknown = !keep_marker && v == (1u64 << (7 * len)) - 1;
    Some(((!unknown).then_some(v), len))
}

/// The elements in `data`: ID and body (an unknown size runs to the end of `data`).
fn elements(data: &[u8]) -> impl Iterator<Item = (u32, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let (id, a) = vint(data.get(at..)?, true)?;
        let (size, b) = vint(data.get(at + a..)?, false)?;
        let start = at + a + b;
        let end = match size {
            Some(n) => start.checked_add(usize::try_from(n).ok()?)?.min(data.len()),
            None => data.len(),
        };
        if start > data.len() {
            return None;
        }
        at = end;
        Some((u32::try_from(id?).ok()?, &data[start..end]))
    })
}

/// The nanoseconds of padding the blocks of track `track` discard, summed.
pub(super) fn discard_padding_ns(data: &[u8], track: u32) -> i64 {
    let mut total = 0i64;
    for (id, segment) in elements(data) {
        if id != SEGMENT {
            continue;
        }
        for (id, cluster) in elements(segment) {
            if id != CLUSTER {
                continue;
            }
            for (id, group) in elements(cluster) {
                if id != BLOCK_GROUP {
                    continue;
                }
                let (mut of_track, mut padding) = (false, 0i64);
                for (id, body) in elements(group) {
                    match id {
                        BLOCK => {
                            of_track = vint(body, false)
                                .and_then(|(n, _)| n)
                                .is_some_and(|n| n == u64::from(track));
                        }
                        DISCARD_PADDING if (1..=8).contains(&body.len()) => {
                            // A signed big-endian integer of 1 to 8 bytes.
                            let mut v = if body[0] & 0x80 != 0 { -1i64 } else { 0 };
                            for &x in body {
                                v = (v << 8) | i64::from(x);
                            }
                            padding = v;
                        }
                        _ => {}
                    }
                }
                if of_track && padding > 0 {
                    total = total.saturating_add(padding);
                }
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(id: &[u8], body: &[u8]) -> Vec<u8> {
        let mut b = id.to_vec();
        b.push(0x80 | body.len() as u8);
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn the_last_blocks_padding_is_found_and_lies_are_bounded() {
        let block = el(&[0xA1], &[0x81, 0, 0, 0x80, 1, 2, 3]);
        let pad = el(&[0x75, 0xA2], &[0x00, 0x7A, 0x12, 0x00]); // 8,000,000 ns
        let group = el(&[0xA0], &[block.clone(), pad].concat());
        let cluster = el(
            &[0x1F, 0x43, 0xB6, 0x75],
            &[el(&[0xE7], &[0]), group].concat(),
        );
        let segment = el(&[0x18, 0x53, 0x80, 0x67], &cluster);
        let file = [el(&[0x1A, 0x45, 0xDF, 0xA3], &[]), segment].concat();
        assert_eq!(discard_padding_ns(&file, 1), 8_000_000);
        assert_eq!(discard_padding_ns(&file, 2), 0);
        for cut in 0..file.len() {
            let _ = discard_padding_ns(&file[..cut], 1);
        }
        // An unknown-size segment runs to the end.
        let mut open = file.clone();
        let at = open
            .windows(4)
            .position(|w| w == [0x18, 0x53, 0x80, 0x67])
            .unwrap()
            + 4;
        open[at] = 0xFF;
        assert_eq!(discard_padding_ns(&open, 1), 8_000_000);
    }
}
