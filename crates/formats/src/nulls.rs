//! What a columnar source (Parquet, Arrow IPC, JSON Lines, Hugging Face tables) does with
//! nulls and structs: the options; the work is `arrow_types`' and `columnar`'s.

/// What a column's nulls are filled with: `number` for numeric columns (NaN for floats and
/// 0 for integers when `None`; a float fill given to an integer column is truncated).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fill {
    /// The number null slots of numeric columns get.
    pub number: Option<f64>,
}

impl PartialEq for Fill {
    fn eq(&self, other: &Fill) -> bool {
        self.number.map(f64::to_bits) == other.number.map(f64::to_bits)
    }
}

impl Eq for Fill {}

/// What a columnar source does with nulls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Nulls {
    /// A column that holds nulls (as the file's metadata says when the source is opened) gets
    /// a `<name>_valid` bool column, true where a value is present, in every batch, and its
    /// null slots the [`Fill`]'s value (the default).
    #[default]
    Mask,
    /// A null is an error naming the file, the column and the row.
    Raise,
    /// Null slots get the [`Fill`]'s value and no `<name>_valid` column marks them (pandas'
    /// `fillna`): where a null and a value of the fill need not be told apart.
    Fill,
}

impl Nulls {
    /// `"mask"`, `"raise"` or `"fill"`.
    pub fn parse(s: &str) -> Result<Nulls, String> {
        match s {
            "mask" => Ok(Nulls::Mask),
            "raise" => Ok(Nulls::Raise),
            "fill" => Ok(Nulls::Fill),
            other => Err(format!(
                "{other:?}; pass \"mask\" (fill them, with a <name>_valid column), \
                 \"fill\" (fill them, no mask) or \"raise\""
            )),
        }
    }
}

/// How a columnar source reads dictionary-encoded columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dictionaries {
    /// Their values, as the value type reads (the default).
    #[default]
    Values,
    /// `[B]` int64 codes into the source's dictionary (see the module docs), which
    /// [`chute_core::ColumnType::dictionary`] gives (see `codes.rs`).
    Codes,
}

impl Dictionaries {
    /// `"values"` or `"codes"`.
    pub fn parse(s: &str) -> Result<Dictionaries, String> {
        match s {
            "values" => Ok(Dictionaries::Values),
            "codes" => Ok(Dictionaries::Codes),
            other => Err(format!(
                "invalid dictionaries: {other:?}; use \"values\" (the default) or \"codes\" \
                 (int64 codes into one dictionary for the source)"
            )),
        }
    }
}

/// How a columnar source reads decimal columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Decimals {
    /// `float64`, the nearest double (exact to 15 significant digits) (the default).
    #[default]
    Float,
    /// Exact: a nested value a row, the decimal's text (a `decimal.Decimal` in Python, as
    /// pyarrow's `to_pylist` and `datasets` give it).
    Exact,
}

impl Decimals {
    /// `"float"` or `"exact"`.
    pub fn parse(s: &str) -> Result<Decimals, String> {
        match s {
            "float" => Ok(Decimals::Float),
            "exact" => Ok(Decimals::Exact),
            other => Err(format!(
                "invalid decimals: {other:?}; use \"float\" (float64, the default) or \
                 \"exact\" (decimal.Decimal values)"
            )),
        }
    }
}

/// How a columnar source reads a struct column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Structs {
    /// One column per leaf, named by its path (`meta.a`, `meta.b.c`) (the default).
    #[default]
    Flatten,
    /// The whole record, one nested value a row (a dict in Python). A leaf named by its path
    /// in `columns` is still read alone.
    Record,
}

impl Structs {
    /// `"flatten"` or `"record"`.
    pub fn parse(s: &str) -> Result<Structs, String> {
        match s {
            "flatten" => Ok(Structs::Flatten),
            "record" => Ok(Structs::Record),
            other => Err(format!(
                "{other:?}; pass \"flatten\" (a column per leaf, named meta.a) or \"record\" \
                 (the whole struct, a dict a row)"
            )),
        }
    }
}
