//! Megatron-Core's indexed datasets: a `.bin` of token ids and a `.idx` index (the
//! `MMIDIDX` format of `megatron.core.datasets.indexed_dataset`), read by [`MegatronIndex`]
//! and written by [`MegatronWriter`], byte for byte as Megatron-Core's `IndexedDatasetBuilder`
//! writes them.
//!
//! The index, all little-endian:
//!
//! | bytes | what |
//! | --- | --- |
//! | 9 | `MMIDIDX\0\0` |
//! | 8 | version, `1` |
//! | 1 | dtype code of the tokens (1 `uint8`, 2 `int8`, 3 `int16`, 4 `int32`, 5 `int64`, 6 `float64`, 7 `float32`, 8 `uint16`) |
//! | 8 | sequence count `S` |
//! | 8 | document-index count `D` |
//! | 4 S | each sequence's length in tokens (`int32`) |
//! | 8 S | each sequence's byte offset in the `.bin` (`int64`) |
//! | 8 D | document indices (`int64`): `0`, then the sequence count after each document |
//! | S | (multimodal datasets only) each sequence's mode (`int8`) |
//!
//! Megatron's `GPTDataset` treats each *sequence* as a document (a document of several
//! sequences comes from `preprocess_data.py --split-sentences`), and so does chute: document
//! `i` is sequence `i`.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use chute_core::{ConfigError, DType, Error};
use chute_io::AtomicFile;

/// The first 9 bytes of a Megatron index.
pub const INDEX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// Bytes before the index's arrays.
const HEADER: usize = 9 + 8 + 1 + 8 + 8;

/// The dtype of Megatron's code `code`.
fn dtype_of(code: u8) -> Option<DType> {
    Some(match code {
        1 => DType::U8,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F64,
        7 => DType::F32,
        8 => DType::U16,
        _ => return None,
    })
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// Megatron's code of `dtype`.
fn code_of(dtype: DType) -> Option<u8> {
    (1..=8).find(|&c| dtype_of(c) == Some(dtype))
}

/// The index and data paths of a Megatron dataset prefix (`data/train_text_document` names
/// `data/train_text_document.idx` and `.bin`); a path ending in `.bin` or `.idx` stands for
/// its prefix.
pub fn paths_of(prefix: &Path) -> (PathBuf, PathBuf) {
    let s = prefix.as_os_str().to_string_lossy();
    let stem = s
        .strip_suffix(".bin")
        .or_else(|| s.strip_suffix(".idx"))
        .unwrap_or(&s);
    (
        PathBuf::from(format!("{stem}.idx")),
        PathBuf::from(format!("{stem}.bin")),
    )
}

/// True when `bytes` start like a Megatron index.
pub fn is_index(bytes: &[u8]) -> bool {
    bytes.starts_with(INDEX_MAGIC)
}

/// A parsed Megatron index over its bytes (a memory map: nothing is copied). Every sequence
/// was checked against the `.bin`'s length when parsed, so reads never leave it.
#[derive(Debug, Clone)]
pub struct MegatronIndex {
    bytes: Bytes,
    dtype: DType,
    sequences: u64,
    /// Entries of the document-index array.
    documents: u64,
    /// Tokens of all sequences.
    tokens: u64,
    multimodal: bool,
}

impl MegatronIndex {
    /// Parses `bytes`, the index `origin`, for a `.bin` of `bin_len` bytes. Fails with
    /// [`Error::Corrupt`] naming `origin`, the offset and what is wrong when the header is not
    /// Megatron's, the arrays do not fit the file (nothing is allocated from the counts), a
    /// sequence lies outside the `.bin` or is not aligned to a token, or the document indices
    /// are not `0, ..., S` in order; with a [`ConfigError`] for float tokens.
    pub fn parse(bytes: Bytes, origin: &str, bin_len: u64) -> Result<MegatronIndex, Error> {
        let bad = |at: usize, why: String| Error::corrupt(origin, at as u64, why);
        if bytes.len() < HEADER {
            return Err(bad(
                0,
                format!(
                    "the index is {} bytes, shorter than the {HEADER}-byte header of a \
                     Megatron index",
                    bytes.len()
                ),
            ));
        }
        if !is_index(&bytes) {
            return Err(bad(
                0,
                "not a Megatron index: it does not start with MMIDIDX (write it with \
                 Megatron-Core's IndexedDatasetBuilder or `chute tokenize`)"
                    .into(),
            ));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let version = u64_at(9);
        if version != 1 {
            return Err(bad(
                9,
                format!("index version {version}; chute reads version 1"),
            ));
        }
        let code = bytes[17];
        let dtype = dtype_of(code).ok_or_else(|| {
            bad(
                17,
                format!("unknown dtype code {code} (Megatron's are 1 to 8)"),
            )
        })?;
        if is_float(dtype) {
            return Err(ConfigError::new(
                "documents",
                format!("{origin} holds {dtype} values; token ids are integers"),
            )
            .into());
        }
        let (sequences, documents) = (u64_at(18), u64_at(26));
        // Check the arrays fit in the file before anything is read from them.
        let need = |modes: u64| -> Option<u64> {
            sequences
                .checked_mul(4 + 8 + modes)?
                .checked_add(documents.checked_mul(8)?)?
                .checked_add(HEADER as u64)
        };
        let len = bytes.len() as u64;
        let multimodal = match (need(0), need(1)) {
            (Some(n), _) if n == len => false,
            (_, Some(n)) if n == len => true,
            _ => {
                return Err(bad(
                    18,
                    format!(
                        "the header claims {sequences} sequences and {documents} document \
                         indices, which need {} bytes, but the index is {len} bytes (cut \
                         short, or not a Megatron index)",
                        need(0).map_or_else(|| "more than 2^64".to_string(), |n| n.to_string())
                    ),
                ));
            }
        };
        let index = MegatronIndex {
            bytes,
            dtype,
            sequences,
            documents,
            tokens: 0,
            multimodal,
        };
        let size = dtype.size() as u64;
        let mut tokens = 0u64;
        for i in 0..sequences {
            let (len, ptr) = (index.length(i), index.pointer(i));
            let at = index.lengths_at() + 4 * i as usize;
            if len < 0 || ptr < 0 {
                return Err(bad(
                    at,
                    format!("sequence {i} has length {len} at byte {ptr}: negative"),
                ));
            }
            let (len, ptr) = (len as u64, ptr as u64);
            let end = len.checked_mul(size).and_then(|b| b.checked_add(ptr));
            if end.is_none_or(|e| e > bin_len) || !ptr.is_multiple_of(size) {
                return Err(bad(
                    at,
                    format!(
                        "sequence {i} ({len} tokens at byte {ptr}) does not lie within the \
                         {bin_len}-byte .bin on a {dtype} boundary (a .bin of another \
                         dataset, or cut short)"
                    ),
                ));
            }
            tokens += len;
        }
        let docs_at = index.docs_at();
        let mut prev = 0i64;
        for j in 0..documents {
            let at = docs_at + 8 * j as usize;
            let d = i64::from_le_bytes(index.bytes[at..at + 8].try_into().expect("8"));
            let ok = if j == 0 {
                d == 0
            } else {
                d >= prev && d as u64 <= sequences
            };
            if !ok {
                return Err(bad(
                    at,
                    format!(
                        "document index {j} is {d}: document indices run from 0 up to the \
                         sequence count ({sequences}) in order"
                    ),
                ));
            }
            prev = d;
        }
        if documents == 0 || prev as u64 != sequences {
            return Err(bad(
                docs_at,
                format!(
                    "the document indices end at {prev}, not at the sequence count \
                     {sequences}"
                ),
            ));
        }
        Ok(MegatronIndex { tokens, ..index })
    }

    fn lengths_at(&self) -> usize {
        HEADER
    }

    fn pointers_at(&self) -> usize {
        HEADER + 4 * self.sequences as usize
    }

    fn docs_at(&self) -> usize {
        HEADER + 12 * self.sequences as usize
    }

    fn length(&self, i: u64) -> i32 {
        let at = self.lengths_at() + 4 * i as usize;
        i32::from_le_bytes(self.bytes[at..at + 4].try_into().expect("4 bytes"))
    }

    fn pointer(&self, i: u64) -> i64 {
        let at = self.pointers_at() + 8 * i as usize;
        i64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes"))
    }

    /// The stored token type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Sequences (chute's documents).
    pub fn len(&self) -> u64 {
        self.sequences
    }

    /// True when the dataset has no sequences.
    pub fn is_empty(&self) -> bool {
        self.sequences == 0
    }

    /// Tokens of all sequences.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Documents in Megatron's sense (groups of sequences): one less than the
    /// document-index entries.
    pub fn megatron_documents(&self) -> u64 {
        self.documents - 1
    }

    /// True when the index has a mode per sequence (a multimodal dataset).
    pub fn multimodal(&self) -> bool {
        self.multimodal
    }

    /// Sequence `i`'s first token (its byte offset over the token size) and its length.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn sequence(&self, i: u64) -> (u64, u64) {
        assert!(i < self.sequences, "sequence {i} of {}", self.sequences);
        (
            self.pointer(i) as u64 / self.dtype.size() as u64,
            self.length(i) as u64,
        )
    }
}

/// Writes a Megatron indexed dataset: `<prefix>.bin` and `<prefix>.idx`, exactly as
/// Megatron-Core's `IndexedDatasetBuilder` does with one `add_item` and one `end_document` per
/// document (so `document_indices` is `0, 1, ..., S`). Both files are written under temporary
/// names; [`MegatronWriter::finish`] renames the `.bin` first and the `.idx` last, so an index
/// under its final name always has its data. Dropping the writer unfinished deletes both.
#[derive(Debug)]
pub struct MegatronWriter {
    bin: AtomicFile,
    idx: PathBuf,
    dtype: DType,
    lengths: Vec<i32>,
    tokens: u64,
    scratch: Vec<u8>,
}

impl MegatronWriter {
    /// Creates the temporary files of the dataset `prefix` (a `.bin`/`.idx` suffix is
    /// dropped) for tokens stored as `dtype` (an integer type: Megatron's `preprocess_data.py`
    /// uses `uint16` below a vocabulary of 65,500 ids, else `int32`).
    pub fn create(prefix: impl AsRef<Path>, dtype: DType) -> Result<MegatronWriter, Error> {
        if is_float(dtype) || code_of(dtype).is_none() {
            return Err(ConfigError::new(
                "dtype",
                format!(
                    "Megatron datasets store token ids as uint8, int8, int16, uint16, int32 or \
                     int64, not {dtype}"
                ),
            )
            .into());
        }
        let (idx, bin) = paths_of(prefix.as_ref());
        Ok(MegatronWriter {
            bin: AtomicFile::create(bin)?,
            idx,
            dtype,
            lengths: Vec::new(),
            tokens: 0,
            scratch: Vec::new(),
        })
    }

    /// The stored dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Documents written so far.
    pub fn documents(&self) -> u64 {
        self.lengths.len() as u64
    }

    /// Tokens written so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Appends one document. Nothing is written, and a [`ConfigError`] names the token,
    /// when an id does not fit the dtype or the document has more than `i32::MAX` tokens.
    pub fn add_document(&mut self, ids: &[u32]) -> Result<(), Error> {
        let len = i32::try_from(ids.len()).map_err(|_| {
            ConfigError::new(
                "documents",
                format!(
                    "document {} has {} tokens; Megatron indexes store lengths as int32",
                    self.lengths.len(),
                    ids.len()
                ),
            )
        })?;
        let max = match self.dtype {
            DType::U8 => u8::MAX as u64,
            DType::I8 => i8::MAX as u64,
            DType::I16 => i16::MAX as u64,
            DType::U16 => u16::MAX as u64,
            DType::I32 => i32::MAX as u64,
            _ => u64::MAX,
        };
        if let Some(i) = ids.iter().position(|&id| u64::from(id) > max) {
            return Err(ConfigError::new(
                "dtype",
                format!(
                    "token {i} of document {} is {}, which does not fit in {}; write a wider \
                     dtype",
                    self.lengths.len(),
                    ids[i],
                    self.dtype
                ),
            )
            .into());
        }
        self.scratch.clear();
        let size = self.dtype.size();
        for &id in ids {
            self.scratch
                .extend_from_slice(&u64::from(id).to_le_bytes()[..size]);
        }
        self.bin
            .write_all(&self.scratch)
            .map_err(|e| self.bin.error(e))?;
        self.lengths.push(len);
        self.tokens += ids.len() as u64;
        Ok(())
    }

    /// Writes the index, renames both files into place (the `.bin`, then the `.idx`) and
    /// returns the number of documents.
    pub fn finish(self) -> Result<u64, Error> {
        let MegatronWriter {
            bin,
            idx,
            dtype,
            lengths,
            ..
        } = self;
        let mut out = AtomicFile::create(&idx)?;
        let n = lengths.len() as u64;
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(INDEX_MAGIC);
        head.extend_from_slice(&1u64.to_le_bytes());
        head.push(code_of(dtype).expect("checked in create"));
        head.extend_from_slice(&n.to_le_bytes());
        head.extend_from_slice(&(n + 1).to_le_bytes());
        let io = |out: &AtomicFile, e| out.error(e);
        out.write_all(&head).map_err(|e| io(&out, e))?;
        let lens: Vec<u8> = lengths.iter().flat_map(|l| l.to_le_bytes()).collect();
        out.write_all(&lens).map_err(|e| io(&out, e))?;
        let size = dtype.size() as i64;
        let mut ptr = 0i64;
        let mut ptrs = Vec::with_capacity(lengths.len() * 8);
        for &l in &lengths {
            ptrs.extend_from_slice(&ptr.to_le_bytes());
            ptr += i64::from(l) * size;
        }
        out.write_all(&ptrs).map_err(|e| io(&out, e))?;
        let docs: Vec<u8> = (0..=n as i64).flat_map(|d| d.to_le_bytes()).collect();
        out.write_all(&docs).map_err(|e| io(&out, e))?;
        bin.finish()?;
        out.finish()?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, docs: &[Vec<u32>], dtype: DType) -> (PathBuf, PathBuf) {
        let mut w = MegatronWriter::create(dir.join("ds"), dtype).unwrap();
        for d in docs {
            w.add_document(d).unwrap();
        }
        assert_eq!(w.finish().unwrap(), docs.len() as u64);
        paths_of(&dir.join("ds"))
    }

    #[test]
    fn writes_and_reads_back_every_integer_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let docs = vec![vec![1, 2, 3], vec![], vec![100, 7], vec![5; 10]];
        for dtype in [
            DType::U8,
            DType::I8,
            DType::I16,
            DType::U16,
            DType::I32,
            DType::I64,
        ] {
            let (idx, bin) = write(dir.path(), &docs, dtype);
            let bin_len = std::fs::metadata(&bin).unwrap().len();
            let ix = MegatronIndex::parse(std::fs::read(&idx).unwrap().into(), "ds.idx", bin_len)
                .unwrap();
            assert_eq!((ix.dtype(), ix.len(), ix.tokens()), (dtype, 4, 15));
            assert_eq!(ix.megatron_documents(), 4);
            assert!(!ix.multimodal());
            let data = std::fs::read(&bin).unwrap();
            let s = dtype.size();
            for (i, d) in docs.iter().enumerate() {
                let (first, len) = ix.sequence(i as u64);
                assert_eq!(len as usize, d.len());
                for (k, &want) in d.iter().enumerate() {
                    let at = (first as usize + k) * s;
                    let mut v = [0u8; 8];
                    v[..s].copy_from_slice(&data[at..at + s]);
                    assert_eq!(u64::from_le_bytes(v), u64::from(want));
                }
            }
        }
        let e = MegatronWriter::create(dir.path().join("f"), DType::F32).unwrap_err();
        assert!(e.to_string().contains("not float32"), "{e}");
        let mut w = MegatronWriter::create(dir.path().join("n"), DType::U8).unwrap();
        let e = w.add_document(&[1, 256]).unwrap_err();
        assert!(
            e.to_string().contains("token 1 of document 0 is 256"),
            "{e}"
        );
    }

    #[test]
    fn hostile_indexes_are_refused_with_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let (idx, bin) = write(dir.path(), &[vec![1, 2], vec![3]], DType::U16);
        let good = std::fs::read(&idx).unwrap();
        let bin_len = std::fs::metadata(&bin).unwrap().len();
        let parse = |b: Vec<u8>, bin_len| {
            MegatronIndex::parse(b.into(), "ds.idx", bin_len)
                .unwrap_err()
                .to_string()
        };
        assert!(parse(good[..20].to_vec(), bin_len).contains("shorter than the 34-byte"));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(parse(b, bin_len).contains("not a Megatron index"));
        let mut b = good.clone();
        b[9] = 2;
        assert!(parse(b, bin_len).contains("version 2"));
        let mut b = good.clone();
        b[17] = 9;
        assert!(parse(b, bin_len).contains("unknown dtype code 9"));
        // A count of 2^60 sequences: refused from the file's length, nothing allocated.
        let mut b = good.clone();
        b[18..26].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(parse(b, bin_len).contains("claims 1152921504606846976 sequences"));
        // The .bin is shorter than the index says.
        assert!(parse(good.clone(), bin_len - 1).contains("does not lie within"));
        // Document indices out of order.
        let mut b = good.clone();
        let at = HEADER + 12 * 2 + 8;
        b[at..at + 8].copy_from_slice(&5i64.to_le_bytes());
        assert!(parse(b, bin_len).contains("document index 1 is 5"));
        // Float tokens are not token ids.
        let mut b = good.clone();
        b[17] = 7;
        let e = MegatronIndex::parse(b.into(), "ds.idx", bin_len).unwrap_err();
        assert!(e.to_string().contains("float32"), "{e}");
    }
}
