//! Decoders for the WebDataset members the `webdataset` package decodes by default beyond
//! text, labels, JSON and `.npy`: msgpack (`.mp`, `.msg`, `.msgpack`), `.npz` archives and
//! tenbin tensors (`.ten`, `.tb`), each to a nested [`Value`] holding what the package's
//! decoder gives (dicts, lists, scalars, numpy arrays); and [`by_extension`], the package's
//! rule for which decoder a member's name picks (the `auto` op).
//!
//! Every length a member claims is checked against the bytes that are there (msgpack, tenbin)
//! or against `max_decoded_bytes` (an `.npz` member's uncompressed size) before anything is
//! allocated for it, and nesting is bounded.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use chute_core::{Array, DType, Value};

/// Deepest nesting a msgpack value may have (as deep as a JSON value may).
const MAX_DEPTH: usize = 128;

/// What a member's name asks the `auto` op to do, by its last extension as the `webdataset`
/// package's default decoder reads it (after a `.gz` it removed): `x.seg.txt` is `txt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    /// `txt`, `text`, `transcript`: UTF-8 text.
    Text,
    /// `cls`, `cls2`, `index`, `inx`, `id`: an integer.
    Label,
    /// `json`, `jsn`.
    Json,
    /// `npy`.
    Npy,
    /// `npz`.
    Npz,
    /// `ten`, `tb`.
    Tenbin,
    /// `mp`, `msg`, `msgpack`.
    Msgpack,
    /// `pyd`, `pkl`, `pickle`: unpickling runs the pickle's code, so it is never done natively.
    Pickle,
    /// Anything else (images, audio, video, `pth`, `cbor`, unknown): the bytes, as the
    /// package's default decoder leaves them.
    Bytes,
}

/// The decoder the `webdataset` package's default decoder picks for a member named `name`.
pub fn by_extension(name: &str) -> Member {
    let name = name.strip_suffix(".gz").unwrap_or(name);
    let ext = name.rsplit('.').next().unwrap_or(name);
    match ext {
        "txt" | "text" | "transcript" => Member::Text,
        "cls" | "cls2" | "index" | "inx" | "id" => Member::Label,
        "json" | "jsn" => Member::Json,
        "npy" => Member::Npy,
        "npz" => Member::Npz,
        "ten" | "tb" => Member::Tenbin,
        "mp" | "msg" | "msgpack" => Member::Msgpack,
        "pyd" | "pkl" | "pickle" => Member::Pickle,
        _ => Member::Bytes,
    }
}

/// A msgpack value, as `msgpack.unpackb` gives it by default: strings as text (UTF-8
/// required), binary as bytes, maps with string keys as records (a repeated key keeps its
/// last value), maps with bytes keys as maps; maps with other keys (`unpackb` refuses them
/// too), extension types, and bytes after the value are refused.
pub fn msgpack(b: &Bytes) -> Result<Value, String> {
    let mut r = Reader { b, at: 0 };
    let v = r.value(0)?;
    if r.at != b.len() {
        return Err(format!(
            "not msgpack: {} bytes after the value, which ends at byte {}",
            b.len() - r.at,
            r.at
        ));
    }
    Ok(v)
}

struct Reader<'a> {
    b: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(format!(
                "not msgpack: truncated at byte {} (a value claims {n} bytes, {} are left)",
                self.at,
                self.b.len() - self.at
            ));
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, String> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |v, &x| (v << 8) | u64::from(x)))
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes, String> {
        let start = self.at;
        self.take(n)?;
        Ok(self.b.slice(start..start + n))
    }

    fn text(&mut self, n: usize) -> Result<Value, String> {
        let at = self.at;
        let b = self.bytes(n)?;
        std::str::from_utf8(&b)
            .map_err(|e| format!("not msgpack text: the string at byte {at} is not UTF-8 ({e})"))?;
        Ok(Value::Text(b))
    }

    /// A count of items, each at least a byte: more than the bytes left is a lie.
    fn count(&mut self, n: u64, per_item: usize) -> Result<usize, String> {
        let left = (self.b.len() - self.at) / per_item;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| {
                format!(
                    "not msgpack: a list or map at byte {} claims {n} items, but {} bytes are left",
                    self.at,
                    self.b.len() - self.at
                )
            })
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!(
                "msgpack nested more than {MAX_DEPTH} deep at byte {}",
                self.at
            ));
        }
        let at = self.at;
        let tag = self.take(1)?[0];
        let int = |v: i64| Value::Int(v);
        Ok(match tag {
            0x00..=0x7f => int(i64::from(tag)),
            0xe0..=0xff => int(i64::from(tag as i8)),
            0x80..=0x8f => self.map(u64::from(tag & 0x0f), depth)?,
            0x90..=0x9f => self.list(u64::from(tag & 0x0f), depth)?,
            0xa0..=0xbf => self.text(usize::from(tag & 0x1f))?,
            0xc0 => Value::Null,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.be(1 << (tag - 0xc4))? as usize;
                Value::Bytes(self.bytes(n)?)
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => {
                let u = self.be(1 << (tag - 0xcc))?;
                i64::try_from(u).map_or(Value::UInt(u), Value::Int)
            }
            0xd0 => int(i64::from(self.be(1)? as u8 as i8)),
            0xd1 => int(i64::from(self.be(2)? as u16 as i16)),
            0xd2 => int(i64::from(self.be(4)? as u32 as i32)),
            0xd3 => int(self.be(8)? as i64),
            0xd9..=0xdb => {
                let n = self.be(1 << (tag - 0xd9))? as usize;
                self.text(n)?
            }
            0xdc | 0xdd => {
                let n = self.be(if tag == 0xdc { 2 } else { 4 })?;
                self.list(n, depth)?
            }
            0xde | 0xdf => {
                let n = self.be(if tag == 0xde { 2 } else { 4 })?;
                self.map(n, depth)?
            }
            0xc7..=0xc9 | 0xd4..=0xd8 => {
                return Err(format!(
                    "msgpack extension type at byte {at} is not supported (chute decodes nil, \
                     bool, int, float, str, bin, array and map); decode the member with your \
                     own transform"
                ));
            }
            0xc1 => {
                return Err(format!(
                    "not msgpack: byte {at} is 0xc1, which is never used"
                ));
            }
        })
    }

    fn list(&mut self, n: u64, depth: usize) -> Result<Value, String> {
        let n = self.count(n, 1)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::List(items))
    }

    fn map(&mut self, n: u64, depth: usize) -> Result<Value, String> {
        let n = self.count(n, 2)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let at = self.at;
            let k = self.value(depth + 1)?;
            if !matches!(k, Value::Text(_) | Value::Bytes(_)) {
                return Err(format!(
                    "msgpack map key at byte {at} is {}; keys must be str or bytes (as \
                     msgpack.unpackb requires by default)",
                    k.describe()
                ));
            }
            entries.push((k, self.value(depth + 1)?));
        }
        if !entries.iter().all(|(k, _)| matches!(k, Value::Text(_))) {
            return Ok(Value::Map(entries));
        }
        let (mut keys, mut values): (Vec<Arc<str>>, Vec<Value>) = (Vec::new(), Vec::new());
        for (k, v) in entries {
            let k = k.as_str().unwrap_or_default();
            match keys.iter().position(|x| **x == *k) {
                Some(i) => values[i] = v,
                None => {
                    keys.push(Arc::from(k));
                    values.push(v);
                }
            }
        }
        Ok(Value::Record(Arc::from(keys), values))
    }
}

/// An `.npz` archive (`numpy.savez`, `savez_compressed`) as `dict(numpy.load(f))` gives it:
/// a record of its members by name (`.npy` removed), each an array (a member that is not an
/// `.npy` file, its bytes, as numpy gives them). Object arrays (pickles) are refused, as
/// numpy refuses them without `allow_pickle`. Each member's size is checked against
/// `max_bytes` before it is read.
pub fn npz(b: &Bytes, max_bytes: u64) -> Result<Value, String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(b.as_ref()))
        .map_err(|e| format!("not an .npz archive (a zip file): {e}"))?;
    let (mut keys, mut values): (Vec<Arc<str>>, Vec<Value>) = (Vec::new(), Vec::new());
    let mut total = 0u64;
    for i in 0..zip.len() {
        let mut f = zip
            .by_index(i)
            .map_err(|e| format!("the .npz archive's member {i}: {e}"))?;
        let name = f
            .name()
            .map_err(|e| format!("the .npz archive's member {i}: {e}"))?
            .to_string();
        let budget = max_bytes.saturating_sub(total);
        let too_large = || {
            format!(
                "the .npz archive's members hold more than max_decoded_bytes ({max_bytes}) \
                 uncompressed (at member {name:?}); raise it with chute.set_limits if the \
                 archive is trusted"
            )
        };
        if f.size() > budget {
            return Err(too_large());
        }
        // The claimed size is a hint only: reading stops past the budget whatever it claims.
        let mut data = Vec::with_capacity(f.size().min(1 << 20) as usize);
        f.by_ref()
            .take(budget + 1)
            .read_to_end(&mut data)
            .map_err(|e| format!("the .npz archive's member {name:?}: {e}"))?;
        if data.len() as u64 > budget {
            return Err(too_large());
        }
        total += data.len() as u64;
        let data = Bytes::from(data);
        let key = name.strip_suffix(".npy").unwrap_or(&name);
        let value = if data.starts_with(b"\x93NUMPY") {
            let (header, body) = chute_core::npy::read_npy(&data, &name)
                .map_err(|e| format!("the .npz archive's member {name:?}: {e}"))?;
            let start = body.as_ptr() as usize - data.as_ptr() as usize;
            Value::Array(Array::new(
                header.dtype(),
                header.shape().to_vec(),
                data.slice(start..start + body.len()),
            ))
        } else {
            Value::Bytes(data)
        };
        keys.push(Arc::from(key));
        values.push(value);
    }
    Ok(Value::Record(Arc::from(keys), values))
}

/// The tenbin magic, the first 8 bytes of each chunk.
const TENBIN_MAGIC: &[u8; 8] = b"~TenBin~";

/// Most dimensions a tenbin tensor may have (the writer refuses 10 or more).
const TENBIN_MAX_DIMS: usize = 32;

/// A tenbin buffer (`webdataset.tenbin`, the `.ten` extension) as `tenbin.decode_buffer`
/// gives it: a list of arrays. Chunks are the magic, a length and the bytes padded to 64;
/// arrays are a header chunk (dtype code, info, rank, dims as int64) and a data chunk.
pub fn tenbin(b: &Bytes) -> Result<Value, String> {
    let mut chunks = Vec::new();
    let mut at = 0usize;
    while at < b.len() {
        let head = b
            .get(at..at + 16)
            .ok_or_else(|| format!("not a tenbin buffer: truncated chunk header at byte {at}"))?;
        if &head[..8] != TENBIN_MAGIC {
            return Err(format!(
                "not a tenbin buffer: no ~TenBin~ magic at byte {at}"
            ));
        }
        let n = i64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
        let start = at + 16;
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| start.checked_add(n))
            .filter(|&e| e <= b.len())
            .ok_or_else(|| {
                format!(
                    "not a tenbin buffer: the chunk at byte {at} claims {n} bytes, {} are left",
                    b.len() - start
                )
            })?;
        chunks.push(b.slice(start..end));
        // Padded to a multiple of 64 (the padding may be missing after the last chunk).
        at = start + (end - start).div_ceil(64) * 64;
    }
    if chunks.len() % 2 != 0 {
        return Err(format!(
            "not a tenbin buffer: {} chunks, not header and data pairs",
            chunks.len()
        ));
    }
    let mut arrays = Vec::with_capacity(chunks.len() / 2);
    for (i, pair) in chunks.chunks_exact(2).enumerate() {
        let (header, data) = (&pair[0], &pair[1]);
        let word = |k: usize| -> Option<i64> {
            header
                .get(8 * k..8 * k + 8)
                .map(|w| i64::from_le_bytes(w.try_into().unwrap_or_default()))
        };
        let bad = |why: &str| format!("tenbin tensor {i}: {why}");
        let code = header
            .get(..8)
            .ok_or_else(|| bad("its header is truncated"))?;
        let code = std::str::from_utf8(code)
            .unwrap_or_default()
            .trim_end_matches('\0');
        let dtype = match code {
            "f2" => DType::F16,
            "f4" => DType::F32,
            "f8" => DType::F64,
            "i1" => DType::I8,
            "i2" => DType::I16,
            "i4" => DType::I32,
            "i8" => DType::I64,
            "u1" => DType::U8,
            "u2" => DType::U16,
            "u4" => DType::U32,
            "u8" => DType::U64,
            _ => return Err(bad(&format!("unsupported dtype code {code:?}"))),
        };
        let rank = word(2).ok_or_else(|| bad("its header is truncated"))?;
        let rank = usize::try_from(rank)
            .ok()
            .filter(|&r| r <= TENBIN_MAX_DIMS)
            .ok_or_else(|| bad(&format!("a rank of {rank}")))?;
        let mut shape = Vec::with_capacity(rank);
        let mut count = 1usize;
        for k in 0..rank {
            let d = word(3 + k).ok_or_else(|| bad("its header is truncated"))?;
            let d = usize::try_from(d).map_err(|_| bad(&format!("a dimension of {d}")))?;
            count = count
                .checked_mul(d)
                .ok_or_else(|| bad("its shape overflows"))?;
            shape.push(d);
        }
        let want = count
            .checked_mul(dtype.size())
            .filter(|&n| n <= data.len())
            .ok_or_else(|| {
                bad(&format!(
                    "its shape {shape:?} of {dtype} needs more than the {} bytes of its data",
                    data.len()
                ))
            })?;
        arrays.push(Value::Array(Array::new(dtype, shape, data.slice(..want))));
    }
    Ok(Value::List(arrays))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp(b: &[u8]) -> Result<Value, String> {
        msgpack(&Bytes::copy_from_slice(b))
    }

    #[test]
    fn msgpack_reads_every_kind() {
        // {"a": [1, -1, 300, 1.5, nil, true, "hi", b"\x01"], "b": {}}
        let b = [
            0x82, 0xa1, b'a', 0x98, 0x01, 0xff, 0xcd, 0x01, 0x2c, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0,
            0, 0xc0, 0xc3, 0xa2, b'h', b'i', 0xc4, 0x01, 0x01, 0xa1, b'b', 0x80,
        ];
        let v = mp(&b).unwrap();
        let Value::Record(keys, values) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(&keys[..], &[Arc::from("a"), Arc::from("b")]);
        assert_eq!(
            values[0],
            Value::List(vec![
                Value::Int(1),
                Value::Int(-1),
                Value::Int(300),
                Value::Float(1.5),
                Value::Null,
                Value::Bool(true),
                Value::Text(Bytes::from_static(b"hi")),
                Value::Bytes(Bytes::from_static(b"\x01")),
            ])
        );
        assert_eq!(
            mp(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap(),
            Value::UInt(u64::MAX)
        );
        assert_eq!(mp(&[0xd0, 0x80]).unwrap(), Value::Int(-128));
    }

    #[test]
    fn msgpack_refuses_lies_and_leftovers() {
        // An array claiming 2^32 - 1 items in 5 bytes allocates nothing.
        let e = mp(&[0xdd, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert!(e.contains("claims 4294967295 items"), "{e}");
        assert!(
            mp(&[0xdb, 0xff, 0xff, 0xff, 0xff])
                .unwrap_err()
                .contains("truncated")
        );
        assert!(mp(&[0x01, 0x02]).unwrap_err().contains("after the value"));
        assert!(mp(&[0xa1, 0xff]).unwrap_err().contains("UTF-8"));
        assert!(
            mp(&[0x81, 0x01, 0x02])
                .unwrap_err()
                .contains("keys must be str")
        );
        assert!(mp(&[0xd4, 0x01, 0x00]).unwrap_err().contains("extension"));
        assert!(mp(&[0x91; 200]).unwrap_err().contains("nested"));
    }

    fn chunk(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(TENBIN_MAGIC);
        out.extend_from_slice(&(b.len() as i64).to_le_bytes());
        out.extend_from_slice(b);
        out.resize(out.len() + (64 - b.len() % 64) % 64, 0);
    }

    #[test]
    fn tenbin_reads_arrays_and_refuses_lies() {
        let mut buf = Vec::new();
        let header: Vec<u8> = [*b"i2\0\0\0\0\0\0", *b"\0\0\0\0\0\0\0\0"]
            .concat()
            .into_iter()
            .chain([2i64, 2, 3].iter().flat_map(|d| d.to_le_bytes()))
            .collect();
        chunk(&mut buf, &header);
        let data: Vec<u8> = (0..6i16).flat_map(i16::to_le_bytes).collect();
        chunk(&mut buf, &data);
        let v = tenbin(&Bytes::from(buf.clone())).unwrap();
        let Value::List(a) = v else { panic!() };
        let Value::Array(a) = &a[0] else { panic!() };
        assert_eq!((a.dtype, &a.shape[..]), (DType::I16, &[2, 3][..]));
        assert_eq!(&a.data[..], &data[..]);
        // A shape bigger than the data is refused.
        let mut lie = Vec::new();
        let header: Vec<u8> = [*b"f8\0\0\0\0\0\0", [0; 8]]
            .concat()
            .into_iter()
            .chain([1i64, 1 << 40].iter().flat_map(|d| d.to_le_bytes()))
            .collect();
        chunk(&mut lie, &header);
        chunk(&mut lie, &[0; 8]);
        assert!(
            tenbin(&Bytes::from(lie))
                .unwrap_err()
                .contains("needs more")
        );
        buf[9] = 0xff; // the first chunk's length
        assert!(tenbin(&Bytes::from(buf)).is_err());
    }

    #[test]
    fn extensions_pick_the_package_decoders() {
        assert_eq!(by_extension("seg.txt"), Member::Text);
        assert_eq!(by_extension("txt.gz"), Member::Text);
        assert_eq!(by_extension("cls"), Member::Label);
        assert_eq!(by_extension("mp"), Member::Msgpack);
        assert_eq!(by_extension("pyd"), Member::Pickle);
        assert_eq!(by_extension("jpg"), Member::Bytes);
    }
}
