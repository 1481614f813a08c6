//! nanoGPT-style token files: [`TokenSource`] reads them, [`TokenWriter`] writes them.
//!
//! A token file is a flat array of little-endian `uint16` or `uint32` token ids with no
//! header (what nanoGPT's `prepare.py` writes with `np.memmap`). Nothing in the file says
//! which of the two it holds, so the reader is told ([`TokenOptions::dtype`]).
//!
//! A sample is a window of `seq_len + 1` consecutive tokens, so that a model trains on
//! `window[..seq_len]` to predict `window[1..]`. Windows do not overlap: window `i` of a file
//! is tokens `i * (seq_len + 1) .. (i + 1) * (seq_len + 1)`, so an epoch visits every token
//! once. (nanoGPT samples random, overlapping offsets instead; fixed windows are what makes
//! an epoch, a shuffle and a checkpoint exact.) Each file is one shard; the tokens after a
//! file's last whole window are not read, and windows never span two files.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use chute_core::{
    Array, ConfigError, DType, Error, Field, Manifest, Sample, ShardInfo, Source, check_cast,
};
use chute_io::AtomicFile;

use crate::Format;

/// The name of the one field of a token sample.
pub const TOKENS_FIELD: &str = "tokens";

/// How to read token files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenOptions {
    /// Tokens a model trains on per sample; a sample holds `seq_len + 1` tokens (inputs and
    /// the shifted targets). At least 1.
    pub seq_len: usize,
    /// The stored token type: [`DType::U16`] or [`DType::U32`], as the file was written.
    pub dtype: DType,
    /// The dtype of the batch tensor: usually [`DType::I64`] (PyTorch's embedding index
    /// type) or [`DType::I32`]; any type [`check_cast`] accepts from `dtype`. Narrowing
    /// (`uint32` to `uint16`) wraps, as numpy's `astype` does.
    pub out_dtype: DType,
}

impl Default for TokenOptions {
    /// GPT-2's setting: `seq_len` 1024, `uint16` tokens, `int64` batches.
    fn default() -> Self {
        TokenOptions {
            seq_len: 1024,
            dtype: DType::U16,
            out_dtype: DType::I64,
        }
    }
}

/// Token files as a [`Source`]: sample `id` is one window of `seq_len + 1` tokens.
///
/// Local files are memory-mapped (with `madvise(MADV_RANDOM)`, since shuffled reads touch
/// pages in random order), never read whole, so a file larger than RAM works and opening costs
/// one `mmap` per file. A URL (`https://`, `s3://`, ...) is downloaded whole when the source
/// is opened (into memory; with a node-local cache directory set, later opens map the cached
/// copy). [`Source::read`] does no per-token work: the sample's `tokens` field is a
/// view of the map of shape `[seq_len + 1]` in the stored dtype, with
/// [`Array::cast`] set to `out_dtype` when they differ, so the batcher widens while it copies
/// the window into the batch.
#[derive(Debug)]
pub struct TokenSource {
    files: Vec<Bytes>,
    manifest: Manifest,
    options: TokenOptions,
    /// Bytes per window: `(seq_len + 1) * dtype.size()`.
    window_bytes: usize,
}

impl TokenSource {
    /// Opens `paths`, one shard each, in order: global ids number the windows of the first
    /// file first.
    ///
    /// Fails with a [`ConfigError`] (in [`Error::Config`]) naming the option if `seq_len` is
    /// 0, `dtype` is not `uint16` or `uint32`, `out_dtype` cannot be cast to, or `paths` is
    /// empty; with [`Error::Io`] if a file cannot be opened or mapped; with
    /// [`Error::Corrupt`] if a file's length is not a whole number of tokens (it was written
    /// with another dtype, or cut short). A file too short for one window is fine and holds
    /// no samples.
    pub fn open<P: AsRef<Path>>(paths: &[P], options: TokenOptions) -> Result<TokenSource, Error> {
        Self::window_bytes(options)?;
        if paths.is_empty() {
            return Err(
                ConfigError::new("paths", "no token files given; pass at least one").into(),
            );
        }
        Self::from_bytes(crate::open_whole(paths, true)?, options)
    }

    /// Checks `options` and returns the bytes of one window.
    fn window_bytes(options: TokenOptions) -> Result<usize, ConfigError> {
        let TokenOptions {
            seq_len,
            dtype,
            out_dtype,
        } = options;
        if seq_len == 0 {
            return Err(ConfigError::new(
                "seq_len",
                "0 tokens per sequence; pass at least 1 (a sample holds seq_len + 1 tokens)",
            ));
        }
        if !matches!(dtype, DType::U16 | DType::U32) {
            return Err(ConfigError::new(
                "dtype",
                format!(
                    "token files store uint16 or uint32 ids, not {dtype}; pass the type the \
                     file was written with"
                ),
            ));
        }
        check_cast(dtype, out_dtype).map_err(|e| ConfigError::new("out_dtype", e.reason))?;
        seq_len
            .checked_add(1)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| {
                ConfigError::new(
                    "seq_len",
                    format!("{seq_len} tokens per sequence do not fit in memory"),
                )
            })
    }

    /// A source over token files already in memory: `(name, bytes)` per shard, in order
    /// (what [`TokenSource::open`] maps or downloads). The same checks and errors as `open`.
    pub fn from_bytes(
        shards: Vec<(String, Bytes)>,
        options: TokenOptions,
    ) -> Result<TokenSource, Error> {
        let window_bytes = Self::window_bytes(options)?;
        let dtype = options.dtype;
        let mut files = Vec::with_capacity(shards.len());
        let mut infos = Vec::with_capacity(shards.len());
        for (name, file) in shards {
            let len = file.len();
            if !len.is_multiple_of(dtype.size()) {
                return Err(Error::corrupt(
                    name,
                    len as u64,
                    format!(
                        "the file's {len} bytes are not a whole number of {dtype} tokens \
                         ({} bytes each); pass the dtype the file was written with, or \
                         rewrite a file that was cut short",
                        dtype.size()
                    ),
                ));
            }
            infos.push(ShardInfo {
                path: name,
                samples: (len / window_bytes) as u64,
                bytes: len as u64,
            });
            files.push(file);
        }
        let manifest = Manifest::new(Format::Tokens.name(), infos)
            .with_param("seq_len", options.seq_len)
            .with_param("dtype", dtype.name());
        Ok(TokenSource {
            files,
            manifest,
            options,
            window_bytes,
        })
    }

    /// The options the files were opened with.
    pub fn options(&self) -> TokenOptions {
        self.options
    }

    /// Each file's bytes, one per shard, in order: a view of its memory map, or its
    /// downloaded contents for a URL.
    pub fn files(&self) -> &[Bytes] {
        &self.files
    }

    /// The raw little-endian bytes of window `id` and their (stored) dtype: a fast path for
    /// benchmarks and consumers that decode tokens themselves.
    ///
    /// # Panics
    /// If `id` is not below `manifest().total_samples()`.
    pub fn window(&self, id: u64) -> (&[u8], DType) {
        let Some((file, start)) = self.locate(id) else {
            panic!(
                "sample id {id} is out of range: the token files hold {} samples",
                self.manifest.total_samples()
            )
        };
        (
            &self.files[file][start..start + self.window_bytes],
            self.options.dtype,
        )
    }

    /// The file index and byte offset of window `id`.
    fn locate(&self, id: u64) -> Option<(usize, usize)> {
        let (shard, pos) = self.manifest.locate(id)?;
        // pos < samples = len / window_bytes, so the product is below the file length, which
        // fits in usize: the file is mapped.
        Some((shard, pos as usize * self.window_bytes))
    }
}

impl Source for TokenSource {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Sample `id`: one field, `tokens`, an array of `seq_len + 1` tokens viewing the map.
    /// Fails with [`Error::Config`] naming the id if `id` is out of range.
    fn read(&self, id: u64) -> Result<Sample, Error> {
        let (file, pos) = self.manifest.locate_checked(id)?;
        let start = pos as usize * self.window_bytes;
        let TokenOptions {
            seq_len,
            dtype,
            out_dtype,
        } = self.options;
        let array = Array {
            dtype,
            shape: vec![seq_len + 1],
            data: self.files[file].slice(start..start + self.window_bytes),
            cast: (out_dtype != dtype).then_some(out_dtype),
        };
        Ok(Sample {
            index: id,
            key: String::new(),
            fields: vec![(Cow::Borrowed(TOKENS_FIELD), Field::Array(array))],
        })
    }
}

/// Writes a token file that [`TokenSource`] reads: ids as little-endian `uint16` or `uint32`.
///
/// Tokens go to `<path>.tmp` (an [`AtomicFile`]), which [`TokenWriter::finish`] flushes,
/// syncs and renames to
/// `path`, so an interrupted write never leaves a file at `path` that looks complete (and a
/// reader with the old `path` mapped keeps its old bytes). Dropping the writer without
/// `finish` deletes the temporary file.
#[derive(Debug)]
pub struct TokenWriter {
    out: AtomicFile,
    dtype: DType,
    written: u64,
    /// Encoded tokens, reused between calls.
    scratch: Vec<u8>,
}

/// Tokens encoded per `write_all`: big enough to amortise the call, small enough to stay in
/// cache.
const ENCODE_CHUNK: usize = 16 * 1024;

impl TokenWriter {
    /// Creates `<path>.tmp` for tokens stored as `dtype` ([`DType::U16`] or [`DType::U32`]).
    ///
    /// Fails with a [`ConfigError`] for another dtype, or [`Error::Io`] naming the temporary
    /// file if it cannot be created.
    pub fn create(path: impl AsRef<Path>, dtype: DType) -> Result<TokenWriter, Error> {
        if !matches!(dtype, DType::U16 | DType::U32) {
            return Err(ConfigError::new(
                "dtype",
                format!("token files store uint16 or uint32 ids, not {dtype}"),
            )
            .into());
        }
        Ok(TokenWriter {
            out: AtomicFile::create(path)?,
            dtype,
            written: 0,
            scratch: Vec::new(),
        })
    }

    /// The stored dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Tokens written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends `ids`.
    ///
    /// For `uint16` files, every id must be at most 65535: otherwise nothing of `ids` is
    /// written and a [`ConfigError`] names the first id that does not fit and its position
    /// in the file, and the writer can still be used. Fails with [`Error::Io`] naming the
    /// temporary file if writing fails.
    pub fn write_tokens(&mut self, ids: &[u32]) -> Result<(), Error> {
        if self.dtype == DType::U16
            && let Some(i) = ids.iter().position(|&id| id > u32::from(u16::MAX))
        {
            return Err(ConfigError::new(
                "dtype",
                format!(
                    "token {} is {}, which does not fit in uint16 (at most 65535); write \
                     uint32 tokens (--dtype uint32)",
                    self.written + i as u64,
                    ids[i]
                ),
            )
            .into());
        }
        for chunk in ids.chunks(ENCODE_CHUNK) {
            self.scratch.clear();
            match self.dtype {
                DType::U16 => self
                    .scratch
                    .extend(chunk.iter().flat_map(|&id| (id as u16).to_le_bytes())),
                _ => self
                    .scratch
                    .extend(chunk.iter().flat_map(|&id| id.to_le_bytes())),
            }
            self.out
                .write_all(&self.scratch)
                .map_err(|e| self.out.error(e))?;
        }
        self.written += ids.len() as u64;
        Ok(())
    }

    /// Flushes and syncs the tokens, renames the temporary file to the final path and
    /// returns the number of tokens written. Fails with [`Error::Io`] naming the file.
    pub fn finish(self) -> Result<u64, Error> {
        self.out.finish()?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{ReaderUnderTest, check_reader};

    /// Token files through the reader conformance suite: windows of 4 `uint16` tokens.
    struct Tokens;

    impl Tokens {
        const OPTIONS: TokenOptions = TokenOptions {
            seq_len: 3,
            dtype: DType::U16,
            out_dtype: DType::U16,
        };

        fn open(shard: &[u8], origin: &str) -> Result<TokenSource, Error> {
            let shards = vec![(origin.to_string(), Bytes::copy_from_slice(shard))];
            TokenSource::from_bytes(shards, Self::OPTIONS)
        }
    }

    impl ReaderUnderTest for Tokens {
        fn name(&self) -> &str {
            "tokens"
        }

        fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error> {
            let mut out = Vec::new();
            for s in samples {
                let Some(Field::Array(a)) = s.get(TOKENS_FIELD) else {
                    return Err(ConfigError::new("sample", "no tokens array").into());
                };
                out.extend_from_slice(&a.data);
            }
            Ok(out)
        }

        fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error> {
            let source = Self::open(shard, origin)?;
            (0..source.manifest().total_samples())
                .map(|id| source.read(id))
                .collect()
        }

        fn read_at(&self, shard: &[u8], origin: &str, i: usize) -> Result<Sample, Error> {
            Self::open(shard, origin)?.read(i as u64)
        }
    }

    #[test]
    fn passes_check_reader() {
        let samples: Vec<Sample> = (0..5u16)
            .map(|i| {
                let ids: Vec<u8> = (0..4u16).flat_map(|k| (i * 10 + k).to_le_bytes()).collect();
                Sample::new(u64::from(i)).with(
                    TOKENS_FIELD,
                    Field::Array(Array::new(DType::U16, vec![4], Bytes::from(ids))),
                )
            })
            .collect();
        check_reader(&Tokens, &samples).unwrap();
    }

    fn write(path: &Path, dtype: DType, ids: &[u32]) {
        let mut w = TokenWriter::create(path, dtype).unwrap();
        w.write_tokens(ids).unwrap();
        assert_eq!(w.finish().unwrap(), ids.len() as u64);
    }

    fn opts(seq_len: usize, dtype: DType, out_dtype: DType) -> TokenOptions {
        TokenOptions {
            seq_len,
            dtype,
            out_dtype,
        }
    }

    fn tokens_of(s: &Sample) -> &Array {
        match s.get(TOKENS_FIELD) {
            Some(Field::Array(a)) => a,
            other => panic!("expected a tokens array, got {other:?}"),
        }
    }

    fn decode(a: &Array) -> Vec<u32> {
        match a.dtype {
            DType::U16 => a
                .data
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DType::U32 => a
                .data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            d => panic!("unexpected dtype {d}"),
        }
    }

    #[test]
    fn round_trips_uint16_windows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.bin");
        let ids: Vec<u32> = (0..105).map(|i| i * 600).collect(); // up to 62400
        write(&path, DType::U16, &ids);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 210);

        let src = TokenSource::open(&[&path], opts(9, DType::U16, DType::I64)).unwrap();
        let m = src.manifest();
        assert_eq!(m.total_samples(), 10); // 105 tokens: 10 windows of 10, 5 left over
        assert_eq!(m.format, "tokens");
        assert_eq!(m.params["seq_len"], 9);
        assert_eq!(m.params["dtype"], "uint16");
        assert_eq!(m.shards[0].path, path.display().to_string());
        assert_eq!(m.shards[0].bytes, 210);

        for id in [0, 3, 9] {
            let s = src.read(id).unwrap();
            assert_eq!(s.index, id);
            assert!(s.key.is_empty());
            let a = tokens_of(&s);
            assert_eq!(a.dtype, DType::U16);
            assert_eq!(a.shape, [10]);
            assert_eq!(a.cast, Some(DType::I64));
            assert_eq!(a.out_dtype(), DType::I64);
            assert_eq!(decode(a), &ids[id as usize * 10..][..10]);
            // Zero-copy: the sample views the same bytes as the fast accessor.
            let (raw, dtype) = src.window(id);
            assert_eq!((raw.as_ptr(), dtype), (a.data.as_ptr(), DType::U16));
        }
        assert!(matches!(src.read(10), Err(Error::Config(_))));
    }

    #[test]
    fn round_trips_uint32_windows_without_cast() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big_vocab.bin");
        let ids: Vec<u32> = (0..12).map(|i| 70_000 + i * 1_000_000).collect();
        write(&path, DType::U32, &ids);

        let src = TokenSource::open(&[&path], opts(3, DType::U32, DType::U32)).unwrap();
        assert_eq!(src.manifest().total_samples(), 3);
        let s = src.read(2).unwrap();
        let a = tokens_of(&s);
        assert_eq!((a.dtype, a.cast), (DType::U32, None));
        assert_eq!(decode(a), &ids[8..12]);

        let src = TokenSource::open(&[&path], opts(3, DType::U32, DType::I32)).unwrap();
        assert_eq!(tokens_of(&src.read(0).unwrap()).cast, Some(DType::I32));
    }

    #[test]
    fn global_ids_run_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        let b = dir.path().join("b.bin");
        let c = dir.path().join("c.bin");
        write(&a, DType::U16, &(0..25).collect::<Vec<_>>()); // 5 windows of 5
        write(&b, DType::U16, &[]); // none
        write(&c, DType::U16, &(100..112).collect::<Vec<_>>()); // 2 windows, 2 left over
        let src = TokenSource::open(&[&a, &b, &c], opts(4, DType::U16, DType::U16)).unwrap();
        let m = src.manifest();
        assert_eq!(m.total_samples(), 7);
        let samples: Vec<u64> = m.shards.iter().map(|s| s.samples).collect();
        assert_eq!(samples, [5, 0, 2]);
        let first: Vec<u32> = (0..7)
            .map(|id| decode(tokens_of(&src.read(id).unwrap()))[0])
            .collect();
        assert_eq!(first, [0, 5, 10, 15, 20, 100, 105]);
        assert_eq!(tokens_of(&src.read(6).unwrap()).cast, None);
    }

    #[test]
    fn empty_and_short_files_hold_no_samples() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.bin");
        let short = dir.path().join("short.bin");
        write(&empty, DType::U16, &[]);
        write(&short, DType::U16, &[1, 2, 3]);
        let src = TokenSource::open(&[&empty, &short], TokenOptions::default()).unwrap();
        assert_eq!(src.manifest().total_samples(), 0);
        assert_eq!(src.manifest().shards[1].bytes, 6);
        assert!(src.read(0).is_err());
    }

    #[test]
    fn odd_length_is_corrupt_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.bin");
        std::fs::write(&path, [0u8; 7]).unwrap();
        let e = TokenSource::open(&[&path], opts(2, DType::U16, DType::I64)).unwrap_err();
        let Error::Corrupt {
            uri,
            offset,
            reason,
            ..
        } = &e
        else {
            panic!("expected a corrupt error, got {e}")
        };
        assert_eq!(*uri, path.display().to_string());
        assert_eq!(*offset, 7);
        assert!(
            reason.contains("uint16") && reason.contains("pass the dtype"),
            "{reason}"
        );

        std::fs::write(&path, [0u8; 6]).unwrap();
        assert!(TokenSource::open(&[&path], opts(2, DType::U32, DType::I64)).is_err());
        assert!(TokenSource::open(&[&path], opts(2, DType::U16, DType::I64)).is_ok());
    }

    #[test]
    fn bad_options_name_the_option() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        write(&path, DType::U16, &[1, 2, 3, 4]);
        let option = |o: TokenOptions| match TokenSource::open(&[&path], o) {
            Err(Error::Config(e)) => e.option,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert_eq!(option(opts(0, DType::U16, DType::I64)), "seq_len");
        assert_eq!(option(opts(usize::MAX, DType::U16, DType::I64)), "seq_len");
        assert_eq!(option(opts(1, DType::I64, DType::I64)), "dtype");
        assert_eq!(option(opts(1, DType::U16, DType::Bool)), "out_dtype");
        assert_eq!(option(opts(1, DType::U16, DType::BF16)), "out_dtype");
        let none: &[&Path] = &[];
        assert!(matches!(
            TokenSource::open(none, TokenOptions::default()),
            Err(Error::Config(e)) if e.option == "paths"
        ));
        let missing = dir.path().join("missing.bin");
        let e = TokenSource::open(&[&missing], TokenOptions::default()).unwrap_err();
        assert!(
            matches!(&e, Error::Io { path, .. } if path.ends_with("missing.bin")),
            "{e}"
        );
        assert!(TokenWriter::create(dir.path().join("x.bin"), DType::I32).is_err());
    }

    #[test]
    fn writer_refuses_ids_too_large_for_uint16() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let mut w = TokenWriter::create(&path, DType::U16).unwrap();
        w.write_tokens(&[1, 2, 3]).unwrap();
        let e = w
            .write_tokens(&[4, 65535, 65536, 5])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("token 5 is 65536") && e.contains("--dtype uint32"),
            "{e}"
        );
        // Nothing of the refused call was written; the writer goes on.
        w.write_tokens(&[65535]).unwrap();
        assert_eq!(w.written(), 4);
        assert_eq!(w.finish().unwrap(), 4);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes, [1, 0, 2, 0, 3, 0, 0xff, 0xff]);
    }

    #[test]
    fn interrupted_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let mut w = TokenWriter::create(&path, DType::U32).unwrap();
        w.write_tokens(&(0..100_000).collect::<Vec<_>>()).unwrap();
        assert!(dir.path().join("w.bin.tmp").exists());
        assert!(!path.exists());
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn sparse_file_larger_than_ram_is_mapped_not_read() {
        if cfg!(not(target_pointer_width = "64")) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.bin");
        let file = std::fs::File::create(&path).unwrap();
        const LEN: u64 = 64 << 30;
        if let Err(e) = file.set_len(LEN) {
            eprintln!("skipping: cannot make a sparse 64 GiB file here: {e}");
            return;
        }
        drop(file);
        let src = match TokenSource::open(&[&path], opts(1023, DType::U16, DType::I64)) {
            Ok(src) => src,
            // A file system or address-space limit that refuses the map is not what this
            // test is about.
            Err(Error::Io { source, .. }) => {
                eprintln!("skipping: cannot map a 64 GiB file here: {source}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let n = LEN / 2 / 1024;
        assert_eq!(src.manifest().total_samples(), n);
        let s = src.read(n - 1).unwrap();
        let a = tokens_of(&s);
        assert_eq!(a.shape, [1024]);
        assert!(a.data.iter().all(|&b| b == 0));
        let (raw, _) = src.window(n - 1);
        let map_end = src.files()[0].as_ptr_range().end;
        assert_eq!(raw.as_ptr_range().end, map_end);
    }
}
