//! The one thing chute reads of an MP4 (M4A) file itself: the audio track's edit list, whose
//! first edit says how many frames the encoder put before the audio (AAC's priming frames,
//! 1,024 or 2,112), which FFmpeg drops and Symphonia's MP4 reader does not. A bounded walk
//! over the boxes: every size is checked against the bytes that hold it.

/// A box's type and contents, from `data`.
fn boxes(data: &[u8]) -> impl Iterator<Item = ([u8; 4], &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let head = data.get(at..at + 8)?;
        let size32 = u32::from_be_bytes(head[..4].try_into().ok()?) as usize;
        let kind: [u8; 4] = head[4..8].try_into().ok()?;
        let (header, size) = match size32 {
            0 => (8, data.len() - at),
            1 => {
                let large = data.get(at + 8..at + 16)?;
                (
                    16,
                    usize::try_from(u64::from_be_bytes(large.try_into().ok()?)).ok()?,
                )
            }
            n => (8, n),
        };
        if size < header || at.checked_add(size)? > data.len() {
            return None;
        }
        let body = &data[at + header..at + size];
        at += size;
        Some((kind, body))
    })
}

fn child<'a>(data: &'a [u8], kind: &[u8; 4]) -> Option<&'a [u8]> {
    boxes(data).find(|(k, _)| k == kind).map(|(_, b)| b)
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The frames (at `rate`) before the audio of track `track_id`, from its first non-empty
/// edit's media time, if the file has an edit list.
pub(super) fn priming(data: &[u8], track_id: u32, rate: u32) -> Option<u64> {
    let moov = child(data, b"moov")?;
    for (kind, trak) in boxes(moov) {
        if &kind != b"trak" {
            continue;
        }
        let tkhd = child(trak, b"tkhd")?;
        let id = if tkhd.first() == Some(&1) {
            be_u32(tkhd, 20)?
        } else {
            be_u32(tkhd, 12)?
        };
        if id != track_id {
            continue;
        }
        let mdhd = child(child(trak, b"mdia")?, b"mdhd")?;
        let timescale = if mdhd.first() == Some(&1) {
            be_u32(mdhd, 20)?
        } else {
            be_u32(mdhd, 12)?
        };
        let elst = child(child(trak, b"edts")?, b"elst")?;
        let v1 = elst.first() == Some(&1);
        let count = be_u32(elst, 4)? as usize;
        let entry = if v1 { 20 } else { 12 };
        for i in 0..count.min(elst.len() / entry) {
            let at = 8 + i * entry;
            let media_time = if v1 {
                be_u64(elst, at + 8)? as i64
            } else {
                i64::from(be_u32(elst, at + 4)? as i32)
            };
            // -1: an empty edit (a delay before the track starts).
            if media_time >= 0 {
                if timescale == 0 {
                    return None;
                }
                let frames =
                    u128::from(media_time as u64) * u128::from(rate) / u128::from(timescale);
                return u64::try_from(frames).ok();
            }
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut b = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        b.extend_from_slice(kind);
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn the_first_edit_gives_the_priming_and_lies_are_ignored() {
        let mut tkhd = vec![0u8; 84];
        tkhd[12..16].copy_from_slice(&2u32.to_be_bytes());
        let mut mdhd = vec![0u8; 24];
        mdhd[12..16].copy_from_slice(&44_100u32.to_be_bytes());
        let mut elst = vec![0u8, 0, 0, 0, 0, 0, 0, 2];
        elst.extend_from_slice(&[0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0, 1, 0, 0]);
        elst.extend_from_slice(&[0, 1, 0, 0, 0, 0, 4, 0, 0, 1, 0, 0]);
        let trak = bx(
            b"trak",
            &[
                bx(b"tkhd", &tkhd),
                bx(b"edts", &bx(b"elst", &elst)),
                bx(b"mdia", &bx(b"mdhd", &mdhd)),
            ]
            .concat(),
        );
        let file = [bx(b"ftyp", b"M4A "), bx(b"moov", &trak)].concat();
        assert_eq!(priming(&file, 2, 44_100), Some(1024));
        assert_eq!(priming(&file, 2, 22_050), Some(512));
        assert_eq!(priming(&file, 3, 44_100), None);
        // A size past the end, a count past the box: nothing found, nothing read out of bounds.
        let mut bad = file.clone();
        bad[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(priming(&bad, 2, 44_100), None);
        for cut in 0..file.len() {
            let _ = priming(&file[..cut], 2, 44_100);
        }
    }
}
