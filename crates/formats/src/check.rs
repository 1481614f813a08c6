//! [`check_reader`]: the one conformance suite every format's reader passes.
//!
//! A format plugs in through [`ReaderUnderTest`] (its writer, its sequential reader and its
//! indexed random-access reader, all over in-memory shards) and the suite checks:
//!
//! - an empty shard reads as no samples or as a clear error, never a panic;
//! - writing samples and reading them back gives the same samples (round trip);
//! - reading sample `i` through the index agrees with sequential reading;
//! - a shard cut short anywhere reads as a prefix of its samples (each one intact) or as an
//!   error naming the shard, never a panic and never garbage;
//! - a flipped byte anywhere never panics; where the format checksums every byte (TFRecord),
//!   it is always an error naming the shard.

use std::panic::{AssertUnwindSafe, catch_unwind};

use chute_core::{Error, Field, Sample};

/// A format under test: its writer and its two read paths, over in-memory shards.
pub trait ReaderUnderTest {
    /// The format's name, for messages.
    fn name(&self) -> &str;

    /// Encodes `samples` as one shard.
    fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error>;

    /// Decodes every sample of `shard`, in order; `origin` names the shard in errors.
    fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error>;

    /// Indexes `shard` and reads sample `i` through the index (the random-access path).
    fn read_at(&self, shard: &[u8], origin: &str, i: usize) -> Result<Sample, Error>;

    /// True when every byte of a shard is covered by a checksum, so any flipped byte must be
    /// detected (TFRecord). Formats that checksum only headers (tar) return false.
    fn checks_every_byte(&self) -> bool {
        false
    }
}

/// Runs the suite on `samples` (which should hold at least two samples with non-empty
/// fields). Returns the first failure as a message.
pub fn check_reader(r: &dyn ReaderUnderTest, samples: &[Sample]) -> Result<(), String> {
    let name = r.name();
    const ORIGIN: &str = "mem://shard-under-test";
    let guarded = |what: &str, f: &mut dyn FnMut() -> Result<Vec<Sample>, Error>| {
        catch_unwind(AssertUnwindSafe(f)).map_err(|_| format!("{name}: {what} panicked"))
    };

    // Empty shard.
    match guarded("reading an empty shard", &mut || r.read_all(&[], ORIGIN))? {
        Ok(v) if v.is_empty() => {}
        Ok(v) => return Err(format!("{name}: an empty shard gave {} samples", v.len())),
        Err(e) => expect_names_origin(name, "empty shard", &e)?,
    }

    // Round trip and random access.
    let bytes = r
        .write(samples)
        .map_err(|e| format!("{name}: write failed: {e}"))?;
    let back = r
        .read_all(&bytes, ORIGIN)
        .map_err(|e| format!("{name}: read back failed: {e}"))?;
    if back.len() != samples.len() {
        return Err(format!(
            "{name}: wrote {} samples, read {}",
            samples.len(),
            back.len()
        ));
    }
    for (i, (a, b)) in samples.iter().zip(&back).enumerate() {
        same_sample(a, b).map_err(|e| format!("{name}: round trip, sample {i}: {e}"))?;
    }
    for (i, want) in back.iter().enumerate() {
        let got = r
            .read_at(&bytes, ORIGIN, i)
            .map_err(|e| format!("{name}: read_at({i}): {e}"))?;
        same_sample(want, &got).map_err(|e| format!("{name}: read_at({i}) vs sequential: {e}"))?;
    }

    // Truncation anywhere: a prefix of the samples, or an error naming the shard.
    for cut in positions(bytes.len()) {
        let short = &bytes[..cut];
        match guarded(&format!("reading the shard cut at byte {cut}"), &mut || {
            r.read_all(short, ORIGIN)
        })? {
            Ok(v) => {
                // A cut that only drops trailing padding may still read every sample; what
                // must never happen is a sample that differs from the original.
                if v.len() > samples.len() {
                    return Err(format!(
                        "{name}: cut at byte {cut}: {} samples read",
                        v.len()
                    ));
                }
                for (i, (a, b)) in samples.iter().zip(&v).enumerate() {
                    same_sample(a, b).map_err(|e| {
                        format!("{name}: cut at byte {cut}: sample {i} is not the original: {e}")
                    })?;
                }
            }
            Err(e) => expect_names_origin(name, &format!("cut at byte {cut}"), &e)?,
        }
    }

    // A flipped byte anywhere: never a panic; always an error if every byte is checksummed.
    for pos in positions(bytes.len())
        .into_iter()
        .filter(|&p| p < bytes.len())
    {
        let mut bad = bytes.clone();
        bad[pos] ^= 0x5a;
        match guarded(
            &format!("reading the shard with byte {pos} flipped"),
            &mut || r.read_all(&bad, ORIGIN),
        )? {
            Ok(_) if r.checks_every_byte() => {
                return Err(format!(
                    "{name}: byte {pos} flipped, yet the shard read cleanly"
                ));
            }
            Ok(_) => {}
            Err(e) => expect_names_origin(name, &format!("byte {pos} flipped"), &e)?,
        }
    }
    Ok(())
}

/// Every position for small shards; otherwise the first and last 512 and a stride between.
fn positions(len: usize) -> Vec<usize> {
    if len <= 4096 {
        return (0..=len).collect();
    }
    let stride = (len / 1024).max(1);
    let mut v: Vec<usize> = (0..512).chain((512..len - 512).step_by(stride)).collect();
    v.extend(len - 512..=len);
    v
}

fn expect_names_origin(name: &str, case: &str, e: &Error) -> Result<(), String> {
    let msg = e.to_string();
    if msg.contains("shard-under-test") {
        Ok(())
    } else {
        Err(format!(
            "{name}: {case}: the error does not name the shard: {msg}"
        ))
    }
}

/// Checks that two samples have the same key and fields (names, kinds, dtypes, shapes and
/// bytes), in order.
pub fn same_sample(a: &Sample, b: &Sample) -> Result<(), String> {
    if a.key != b.key {
        return Err(format!("key {:?} != {:?}", a.key, b.key));
    }
    let names = |s: &Sample| {
        s.fields
            .iter()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>()
    };
    if names(a) != names(b) {
        return Err(format!("fields {:?} != {:?}", names(a), names(b)));
    }
    for ((name, x), (_, y)) in a.fields.iter().zip(&b.fields) {
        let same = match (x, y) {
            (Field::Bytes(p), Field::Bytes(q)) | (Field::Text(p), Field::Text(q)) => p == q,
            (Field::Array(p), Field::Array(q)) => {
                p.dtype == q.dtype && p.shape == q.shape && p.data == q.data
            }
            _ => false,
        };
        if !same {
            return Err(format!("field {name:?}: {x:?} != {y:?}"));
        }
    }
    Ok(())
}
