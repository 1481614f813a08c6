//! Element types of tensors, with the widening/narrowing copy the batcher fuses into collation.

use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;

/// The element type of a tensor. Names follow numpy (`uint16`, `int64`, `float32`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DType {
    /// `bool`, one byte per element (0 or 1).
    Bool,
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `uint16`.
    U16,
    /// `int16`.
    I16,
    /// `uint32`.
    U32,
    /// `int32`.
    I32,
    /// `uint64`.
    U64,
    /// `int64`.
    I64,
    /// IEEE half precision, stored as raw `u16` bits.
    F16,
    /// bfloat16, stored as raw `u16` bits.
    BF16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// numpy's name for the dtype.
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::U16 => "uint16",
            DType::I16 => "int16",
            DType::U32 => "uint32",
            DType::I32 => "int32",
            DType::U64 => "uint64",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = ConfigError;

    /// Accepts numpy names (`int64`) and short names (`i64`, `u16`, `f32`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "bool" => DType::Bool,
            "uint8" | "u8" => DType::U8,
            "int8" | "i8" => DType::I8,
            "uint16" | "u16" => DType::U16,
            "int16" | "i16" => DType::I16,
            "uint32" | "u32" => DType::U32,
            "int32" | "i32" => DType::I32,
            "uint64" | "u64" => DType::U64,
            "int64" | "i64" => DType::I64,
            "float16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float32" | "f32" | "float" => DType::F32,
            "float64" | "f64" | "double" => DType::F64,
            _ => {
                return Err(ConfigError::new(
                    "dtype",
                    format!(
                        "unknown dtype {s:?}; expected one of bool, uint8, int8, uint16, int16, \
                         uint32, int32, uint64, int64, float16, bfloat16, float32, float64"
                    ),
                ));
            }
        })
    }
}

/// A Rust type that is the element of a [`DType`]; lets typed views of tensors be safe.
///
/// # Safety
/// Implementors must be plain old data: every bit pattern valid, no padding, and
/// `size_of::<Self>() == Self::DTYPE.size()`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The dtype with this layout.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        // SAFETY: primitive numeric types are plain old data of the dtype's size.
        unsafe impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
         i64 => I64, f32 => F32, f64 => F64);

/// Why a cast is refused.
fn cast_error(from: DType, to: DType) -> ConfigError {
    ConfigError::new(
        "cast",
        format!(
            "cannot cast {from} to {to}: chute casts between integer types and from integers or \
             floats to float32/float64; decode half floats with a transform"
        ),
    )
}

/// Checks that [`cast_into`] supports `from -> to`.
pub fn check_cast(from: DType, to: DType) -> Result<(), ConfigError> {
    use DType::*;
    let int = |d: DType| matches!(d, Bool | U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64);
    let ok = from == to
        || (int(from) && int(to) && to != Bool)
        || ((int(from) || matches!(from, F32 | F64)) && matches!(to, F32 | F64));
    if ok {
        Ok(())
    } else {
        Err(cast_error(from, to))
    }
}

/// Copies little-endian elements of `from` in `src` into `dst` as `to`, converting each element
/// as numpy's `astype` does (integers wrap, floats to ints are refused by [`check_cast`]).
///
/// `dst.len()` must be `src.len() / from.size() * to.size()`. Equal dtypes are a plain memcpy;
/// widening loops compile to vector code. `src` needs no alignment (it may be a slice of a
/// memory map or a record).
///
/// # Panics
/// If the lengths disagree or the cast is not supported; callers check with [`check_cast`].
pub fn cast_into(from: DType, src: &[u8], to: DType, dst: &mut [u8]) {
    let n = src.len() / from.size();
    assert_eq!(
        src.len(),
        n * from.size(),
        "source length is not a whole number of elements"
    );
    assert_eq!(
        dst.len(),
        n * to.size(),
        "destination length does not match the element count"
    );
    if from == to || (from.size() == to.size() && check_cast(from, to).is_ok() && !is_float(to)) {
        // Same width integers (u16 -> i16 wraps exactly as numpy's astype does).
        dst.copy_from_slice(src);
        return;
    }
    macro_rules! run {
        ($read:ty, $write:ty, $conv:expr) => {{
            const R: usize = size_of::<$read>();
            const W: usize = size_of::<$write>();
            for (s, d) in src.chunks_exact(R).zip(dst.chunks_exact_mut(W)) {
                let v = <$read>::from_le_bytes(s.try_into().unwrap());
                let conv: fn($read) -> $write = $conv;
                d.copy_from_slice(&conv(v).to_le_bytes());
            }
        }};
    }
    macro_rules! from_int {
        ($read:ty) => {
            match to {
                DType::U8 => run!($read, u8, |v| v as u8),
                DType::I8 => run!($read, i8, |v| v as i8),
                DType::U16 => run!($read, u16, |v| v as u16),
                DType::I16 => run!($read, i16, |v| v as i16),
                DType::U32 => run!($read, u32, |v| v as u32),
                DType::I32 => run!($read, i32, |v| v as i32),
                DType::U64 => run!($read, u64, |v| v as u64),
                DType::I64 => run!($read, i64, |v| v as i64),
                DType::F32 => run!($read, f32, |v| v as f32),
                DType::F64 => run!($read, f64, |v| v as f64),
                _ => panic!("{}", cast_error(from, to)),
            }
        };
    }
    match from {
        DType::Bool | DType::U8 => from_int!(u8),
        DType::I8 => from_int!(i8),
        DType::U16 => from_int!(u16),
        DType::I16 => from_int!(i16),
        DType::U32 => from_int!(u32),
        DType::I32 => from_int!(i32),
        DType::U64 => from_int!(u64),
        DType::I64 => from_int!(i64),
        DType::F32 if to == DType::F64 => run!(f32, f64, |v| v as f64),
        DType::F64 if to == DType::F32 => run!(f64, f32, |v| v as f32),
        _ => panic!("{}", cast_error(from, to)),
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_matches_numpy_astype() {
        let src: Vec<u8> = [1u16, 65535, 300]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut dst = vec![0u8; 3 * 8];
        cast_into(DType::U16, &src, DType::I64, &mut dst);
        let got: Vec<i64> = dst
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [1, 65535, 300]);

        let src: Vec<u8> = [-1i32, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut dst = vec![0u8; 2 * 2];
        cast_into(DType::I32, &src, DType::U16, &mut dst);
        assert_eq!(dst, [0xff, 0xff, 7, 0]);
    }

    #[test]
    fn float_to_int_is_refused() {
        assert!(check_cast(DType::F32, DType::I64).is_err());
        assert!(check_cast(DType::U16, DType::Bool).is_err());
        assert!(check_cast(DType::U16, DType::F32).is_ok());
    }

    #[test]
    fn parses_names() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!("i64".parse::<DType>().unwrap(), DType::I64);
        assert!(
            "int128"
                .parse::<DType>()
                .unwrap_err()
                .to_string()
                .contains("int128")
        );
    }
}
