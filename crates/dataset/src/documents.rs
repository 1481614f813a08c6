//! Token documents: where each document's tokens lie in token files, for the packers
//! ([`crate::pack`]).
//!
//! [`Documents`] comes from Megatron indexed datasets ([`Documents::megatron`]: the index says
//! where each document is, nothing is scanned) or from flat token files whose documents end
//! with an end-of-sequence id ([`Documents::split_at_eos`]: the files are scanned once when
//! opened), or from a column of token lists ([`Documents::from_column`]: Hugging Face's
//! tokenized Parquet or Arrow, one row per document, copied into memory when opened). Token
//! data of files stays in their memory maps.

use std::path::Path;

use bytes::Bytes;
use chute_core::{ConfigError, DType, Error, Field, Source, cast_into};

use chute_formats::megatron::{self, MegatronIndex};
use chute_formats::open_whole;

/// Where a file's documents are.
#[derive(Debug, Clone)]
enum Bounds {
    /// A Megatron index: document `i` is sequence `i`.
    Megatron(MegatronIndex),
    /// The first token of each document, then the file's token count.
    Starts(Vec<u64>),
}

/// The documents of one or more token files, in order: file 0's first.
#[derive(Debug, Clone)]
pub struct Documents {
    files: Vec<Bytes>,
    names: Vec<String>,
    bounds: Vec<Bounds>,
    dtype: DType,
    /// Global index of each file's first document, then the total.
    starts: Vec<u64>,
    tokens: u64,
    /// Per-token labels (`int64`, -100 where the loss ignores a token), laid out as the
    /// tokens of file 0: a tokenized column's `labels`.
    labels: Option<Bytes>,
    /// What the documents are, for manifests: `megatron`, `eos:<id>`, `column:<name>` or
    /// `text:<field>:<tokenizer>`.
    kind: String,
}

impl Documents {
    /// The documents of Megatron indexed datasets: each of `prefixes` names a `.bin` and
    /// `.idx` pair (`data/train_text_document`, or either file's path). All must store one
    /// token dtype.
    pub fn megatron<P: AsRef<Path>>(prefixes: &[P]) -> Result<Documents, Error> {
        if prefixes.is_empty() {
            return Err(ConfigError::new("paths", "no Megatron datasets given").into());
        }
        let mut paths = Vec::with_capacity(prefixes.len() * 2);
        for p in prefixes {
            let (idx, bin) = megatron::paths_of(p.as_ref());
            paths.push(idx);
            paths.push(bin);
        }
        let opened = open_whole(&paths, true)?;
        let mut files = Vec::new();
        let mut names = Vec::new();
        let mut bounds = Vec::new();
        let mut dtype = None;
        for pair in opened.chunks_exact(2) {
            let ((idx_name, idx), (bin_name, bin)) = (&pair[0], &pair[1]);
            let index = MegatronIndex::parse(idx.clone(), idx_name, bin.len() as u64)?;
            match dtype {
                None => dtype = Some((index.dtype(), bin_name.clone())),
                Some((d, ref first)) if d != index.dtype() => {
                    return Err(ConfigError::new(
                        "paths",
                        format!(
                            "{first} stores {d} tokens but {bin_name} stores {}; datasets read \
                             together share a dtype",
                            index.dtype()
                        ),
                    )
                    .into());
                }
                Some(_) => {}
            }
            files.push(bin.clone());
            names.push(bin_name.clone());
            bounds.push(Bounds::Megatron(index));
        }
        let dtype = dtype.expect("at least one dataset").0;
        Ok(Self::assemble(
            files,
            names,
            bounds,
            dtype,
            "megatron".into(),
        ))
    }

    /// The documents of flat token files (nanoGPT's `.bin`, of `dtype`): each ends with the
    /// id `eos` (kept as its last token); tokens after a file's last `eos` are one more
    /// document. Documents never span files.
    pub fn split_at_eos<P: AsRef<Path>>(
        paths: &[P],
        dtype: DType,
        eos: u32,
    ) -> Result<Documents, Error> {
        if !matches!(dtype, DType::U16 | DType::U32) {
            return Err(ConfigError::new(
                "dtype",
                format!("token files store uint16 or uint32 ids, not {dtype}"),
            )
            .into());
        }
        if dtype == DType::U16 && eos > u32::from(u16::MAX) {
            return Err(ConfigError::new(
                "eos_id",
                format!("{eos} does not fit in the files' uint16 tokens"),
            )
            .into());
        }
        if paths.is_empty() {
            return Err(ConfigError::new("paths", "no token files given").into());
        }
        let mut files = Vec::new();
        let mut names = Vec::new();
        let mut bounds = Vec::new();
        for (name, data) in open_whole(paths, false)? {
            let size = dtype.size();
            if !data.len().is_multiple_of(size) {
                return Err(Error::corrupt(
                    &name,
                    data.len() as u64,
                    format!(
                        "the file's {} bytes are not a whole number of {dtype} tokens",
                        data.len()
                    ),
                ));
            }
            let n = (data.len() / size) as u64;
            let mut starts = vec![0u64];
            match dtype {
                DType::U16 => {
                    let e = (eos as u16).to_le_bytes();
                    for (i, t) in data.chunks_exact(2).enumerate() {
                        if t == e {
                            starts.push(i as u64 + 1);
                        }
                    }
                }
                _ => {
                    let e = eos.to_le_bytes();
                    for (i, t) in data.chunks_exact(4).enumerate() {
                        if t == e {
                            starts.push(i as u64 + 1);
                        }
                    }
                }
            }
            if *starts.last().expect("0") != n {
                starts.push(n);
            }
            files.push(data);
            names.push(name);
            bounds.push(Bounds::Starts(starts));
        }
        Ok(Self::assemble(
            files,
            names,
            bounds,
            dtype,
            format!("eos:{eos}"),
        ))
    }

    /// The documents of a column of token lists, one row per document (Hugging Face's
    /// tokenized datasets: an `input_ids` column of `list<int32>` or `list<int64>`, in
    /// Parquet or Arrow), read from `source` (a Parquet or Arrow source projected to the
    /// columns) when opened: the tokens are copied into memory, in the column's dtype. With
    /// `labels`, that column's lists (as long as the ids, any integer type) are the tokens'
    /// labels (supervised fine-tuning's -100 on the prompt), kept as `int64`. `name` names the
    /// data in manifests.
    pub fn from_column(
        source: &dyn Source,
        column: &str,
        labels: Option<&str>,
        name: &str,
    ) -> Result<Documents, Error> {
        let n = source.manifest().total_samples();
        let mut data: Vec<u8> = Vec::new();
        let mut label_data: Vec<u8> = Vec::new();
        let mut starts = vec![0u64];
        let mut dtype: Option<DType> = None;
        for id in 0..n {
            let sample = source.read(id)?;
            let a = ids_of(&sample, column, name, id)?;
            let d = a.dtype;
            match dtype {
                None => dtype = Some(d),
                Some(first) if first != d => {
                    return Err(Error::corrupt(
                        name,
                        id,
                        format!("row {id} of {column:?} is {d} where earlier rows are {first}"),
                    ));
                }
                Some(_) => {}
            }
            data.extend_from_slice(&a.data);
            let len = a.data.len() / d.size();
            if let Some(lc) = labels {
                let l = ids_of(&sample, lc, name, id)?;
                if l.data.len() / l.dtype.size() != len {
                    return Err(Error::corrupt(
                        name,
                        id,
                        format!(
                            "row {id}: {lc:?} holds {} labels for {len} ids in {column:?}",
                            l.data.len() / l.dtype.size()
                        ),
                    ));
                }
                let at = label_data.len();
                label_data.resize(at + len * 8, 0);
                cast_into(l.dtype, &l.data, DType::I64, &mut label_data[at..]);
            }
            starts.push((data.len() / d.size()) as u64);
        }
        let dtype = dtype.unwrap_or(DType::I64);
        let kind = match labels {
            Some(l) => format!("column:{column}:labels:{l}"),
            None => format!("column:{column}"),
        };
        let mut docs = Self::in_memory(Bytes::from(data), name.to_string(), starts, dtype, kind);
        docs.labels = labels.map(|_| Bytes::from(label_data));
        Ok(docs)
    }

    /// Documents of tokens in memory: `data` holds ids of `dtype`, document `i` is tokens
    /// `starts[i]..starts[i + 1]`; `name` and `kind` describe them in manifests.
    pub(crate) fn in_memory(
        data: Bytes,
        name: String,
        starts: Vec<u64>,
        dtype: DType,
        kind: String,
    ) -> Documents {
        Self::assemble(
            vec![data],
            vec![name],
            vec![Bounds::Starts(starts)],
            dtype,
            kind,
        )
    }

    fn assemble(
        files: Vec<Bytes>,
        names: Vec<String>,
        bounds: Vec<Bounds>,
        dtype: DType,
        kind: String,
    ) -> Documents {
        let mut starts = vec![0u64];
        let mut tokens = 0;
        for b in &bounds {
            let (docs, t) = match b {
                Bounds::Megatron(ix) => (ix.len(), ix.tokens()),
                Bounds::Starts(s) => (s.len() as u64 - 1, *s.last().expect("one")),
            };
            starts.push(starts.last().expect("one") + docs);
            tokens += t;
        }
        Documents {
            files,
            names,
            bounds,
            dtype,
            starts,
            tokens,
            labels: None,
            kind,
        }
    }

    /// The documents with per-token labels (`int64`, laid out as the tokens of file 0).
    pub(crate) fn with_labels(mut self, labels: Bytes) -> Documents {
        self.labels = Some(labels);
        self
    }

    /// Documents in all files.
    pub fn len(&self) -> u64 {
        *self.starts.last().expect("one")
    }

    /// True when there are no documents.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens of all documents.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The stored token type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The token files' names (paths or URLs), in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The token files' lengths in bytes, in order.
    pub fn sizes(&self) -> Vec<u64> {
        self.files.iter().map(|f| f.len() as u64).collect()
    }

    /// `megatron`, `eos:<id>` or `column:<name>`: how the documents were found.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Whether the tokens have labels ([`Documents::from_column`] with a labels column).
    pub fn has_labels(&self) -> bool {
        self.labels.is_some()
    }

    /// The `int64` labels of tokens `first..first + len` of file 0, if the tokens have labels.
    pub fn label_bytes(&self, first: u64, len: u64) -> Option<&[u8]> {
        let l = self.labels.as_ref()?;
        Some(&l[first as usize * 8..(first + len) as usize * 8])
    }

    /// Document `d`: (file, first token, length).
    ///
    /// # Panics
    /// If `d >= len()`.
    #[inline]
    pub fn doc(&self, d: u64) -> (usize, u64, u64) {
        assert!(d < self.len(), "document {d} of {}", self.len());
        let f = if self.files.len() == 1 {
            0
        } else {
            self.starts.partition_point(|&s| s <= d) - 1
        };
        let local = d - self.starts[f];
        match &self.bounds[f] {
            Bounds::Megatron(ix) => {
                let (first, len) = ix.sequence(local);
                (f, first, len)
            }
            Bounds::Starts(s) => {
                let i = local as usize;
                (f, s[i], s[i + 1] - s[i])
            }
        }
    }

    /// Document `d`'s length in tokens.
    #[inline]
    pub fn doc_len(&self, d: u64) -> u64 {
        self.doc(d).2
    }

    /// The stored bytes of tokens `first..first + len` of file `file`.
    #[inline]
    pub fn token_bytes(&self, file: usize, first: u64, len: u64) -> &[u8] {
        let s = self.dtype.size();
        &self.files[file][first as usize * s..(first + len) as usize * s]
    }
}

/// Row `id`'s list of integer ids in `column`, or an error naming the column.
fn ids_of<'a>(
    sample: &'a chute_core::Sample,
    column: &str,
    name: &str,
    id: u64,
) -> Result<&'a chute_core::Array, Error> {
    let Some(Field::Array(a)) = sample.get(column) else {
        return Err(ConfigError::new(
            "columns",
            format!(
                "{name}: row {id} has no list of token ids in column {column:?} (name the \
                 columns holding them: columns=[ids, labels])"
            ),
        )
        .into());
    };
    if !matches!(
        a.dtype,
        DType::U8
            | DType::I8
            | DType::U16
            | DType::I16
            | DType::U32
            | DType::I32
            | DType::U64
            | DType::I64
    ) || a.shape.len() > 1
    {
        return Err(ConfigError::new(
            "columns",
            format!(
                "{name}: column {column:?} holds {} {:?}, not lists of integer ids",
                a.dtype, a.shape
            ),
        )
        .into());
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chute_formats::megatron::MegatronWriter;

    #[test]
    fn megatron_and_eos_documents_agree() {
        let dir = tempfile::tempdir().unwrap();
        let docs: Vec<Vec<u32>> = vec![vec![5, 6, 0], vec![7, 0], vec![8, 9, 10, 0]];
        let mut w = MegatronWriter::create(dir.path().join("a"), DType::U16).unwrap();
        for d in &docs[..2] {
            w.add_document(d).unwrap();
        }
        w.finish().unwrap();
        let mut w = MegatronWriter::create(dir.path().join("b"), DType::U16).unwrap();
        w.add_document(&docs[2]).unwrap();
        w.finish().unwrap();
        let m = Documents::megatron(&[dir.path().join("a"), dir.path().join("b.bin")]).unwrap();
        // The same tokens as flat files, documents ending with 0; b's tail has no EOS.
        let flat = |name: &str, ids: &[u16]| {
            let p = dir.path().join(name);
            std::fs::write(
                &p,
                ids.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>(),
            )
            .unwrap();
            p
        };
        let e = Documents::split_at_eos(
            &[
                flat("a.tok", &[5, 6, 0, 7, 0]),
                flat("b.tok", &[8, 9, 10, 0, 11]),
            ],
            DType::U16,
            0,
        )
        .unwrap();
        assert_eq!((m.len(), m.tokens(), m.kind()), (3, 9, "megatron"));
        assert_eq!((e.len(), e.tokens(), e.kind()), (4, 10, "eos:0"));
        for d in 0..3 {
            let (mf, mfirst, mlen) = m.doc(d);
            let (ef, efirst, elen) = e.doc(d);
            assert_eq!(
                m.token_bytes(mf, mfirst, mlen),
                e.token_bytes(ef, efirst, elen),
                "document {d}"
            );
        }
        assert_eq!(e.doc(3), (1, 4, 1));
        let err =
            Documents::split_at_eos(&[dir.path().join("a.tok")], DType::U16, 70000).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
    }
}
