//! [`Batch`]: named columns of a whole batch, each a few contiguous buffers.

use crate::buffer::BufferPool;
use crate::dtype::DType;
use crate::tensor::Tensor;

/// A column of a batch.
#[derive(Debug)]
#[non_exhaustive]
pub enum Column {
    /// Fixed-shape values: one `[B, ...]` tensor.
    Tensor(Tensor),
    /// Variable-length bytes or strings.
    Var(VarColumn),
    /// Arrays whose shapes differ between samples (an image without a crop, say): one tensor
    /// per sample, all of one dtype. Ask the loader for padding to get one tensor and a mask.
    List(Vec<Tensor>),
    /// Nested values, one per sample (lists of strings, records, maps): handed to Python as
    /// lists, dicts and scalars.
    Values(Vec<crate::Value>),
    /// Nested values kept in a source's own form (rows of Arrow arrays): what a columnar
    /// source gathers for a nested column, read as [`crate::Value`]s on request.
    Nested(std::sync::Arc<dyn crate::NestedRows>),
    /// A value the engine carries without looking inside: what a source's own collation
    /// made of the whole batch (the result of a Python `collate_fn`). It has no bytes to
    /// pin or digest.
    Object(Opaque),
}

/// An opaque, shareable value in a batch ([`Column::Object`]); the consumer that asked for it
/// downcasts it.
#[derive(Clone)]
pub struct Opaque(pub std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Opaque(..)")
    }
}

impl Column {
    /// The tensor, if this is a fixed-shape column.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Column::Tensor(t) => Some(t),
            Column::Var(_)
            | Column::List(_)
            | Column::Values(_)
            | Column::Nested(_)
            | Column::Object(_) => None,
        }
    }

    /// Bytes of payload (what a consumer receives).
    pub fn nbytes(&self) -> usize {
        match self {
            Column::Tensor(t) => t.as_bytes().len(),
            Column::Var(v) => v.data.as_bytes().len() + v.offsets.as_bytes().len(),
            Column::List(ts) => ts.iter().map(|t| t.as_bytes().len()).sum(),
            Column::Values(v) => v.iter().map(crate::Value::nbytes).sum(),
            Column::Nested(rows) => rows.nbytes(),
            Column::Object(_) => 0,
        }
    }
}

/// Variable-length values as Arrow lays them out: `offsets` (`int64`, `[B + 1]`) into one
/// contiguous `data` buffer (`uint8`); value `i` is `data[offsets[i]..offsets[i + 1]]`.
#[derive(Debug)]
pub struct VarColumn {
    /// `int64 [B + 1]`, starting at 0.
    pub offsets: Tensor,
    /// `uint8 [total]`.
    pub data: Tensor,
    /// True when every value is UTF-8 text.
    pub text: bool,
}

impl VarColumn {
    /// Copies `values` into one data buffer with its offsets, both from `pool`. `values` is
    /// walked twice (lengths, then bytes), so it must yield the same slices each time.
    pub fn collect<'a, I>(pool: &BufferPool, values: I, text: bool) -> VarColumn
    where
        I: Iterator<Item = &'a [u8]> + Clone,
    {
        let (n, total) = values
            .clone()
            .fold((0usize, 0usize), |(n, t), v| (n + 1, t + v.len()));
        let mut offsets = pool.take((n + 1) * DType::I64.size());
        let mut data = pool.take(total);
        {
            let (offs, bytes) = (offsets.as_mut_slice(), data.as_mut_slice());
            offs[..8].copy_from_slice(&0i64.to_le_bytes());
            let mut pos = 0usize;
            for (i, v) in values.enumerate() {
                bytes[pos..pos + v.len()].copy_from_slice(v);
                pos += v.len();
                offs[(i + 1) * 8..(i + 2) * 8].copy_from_slice(&(pos as i64).to_le_bytes());
            }
        }
        VarColumn {
            offsets: Tensor::new(DType::I64, vec![n + 1], offsets),
            data: Tensor::new(DType::U8, vec![total], data),
            text,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.offsets.numel().saturating_sub(1)
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn get(&self, i: usize) -> &[u8] {
        let off = self.offsets.as_slice::<i64>().expect("offsets are int64");
        &self.data.as_bytes()[off[i] as usize..off[i + 1] as usize]
    }
}

/// One batch as delivered to the consumer.
#[derive(Debug)]
pub struct Batch {
    /// Named columns, in the order of the first sample's fields.
    pub columns: Vec<(String, Column)>,
    /// Global sample ids of the rows, in row order.
    pub ids: Vec<u64>,
    /// The epoch this batch belongs to.
    pub epoch: u64,
    /// Position of this batch within the rank's epoch (0-based).
    pub index: u64,
}

impl Batch {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The column called `name`.
    pub fn get(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// Payload bytes of all columns.
    pub fn nbytes(&self) -> usize {
        self.columns.iter().map(|(_, c)| c.nbytes()).sum()
    }
}
