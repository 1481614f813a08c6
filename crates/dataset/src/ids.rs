//! Token ids from other tools' output: whitespace-separated text ([`parse_token_text`]) and
//! integer `.npy` arrays ([`token_ids_from_npy`]), ready for a
//! [`TokenWriter`](chute_formats::TokenWriter).

use chute_core::{DType, Error};

use chute_core::npy::read_npy;

/// Longest piece of a bad token quoted in an error message.
const QUOTE_MAX: usize = 40;

/// Parses whitespace-separated non-negative integer token ids (`"15496 11 995\n"`).
///
/// Any Unicode whitespace separates ids; every other character must belong to a decimal id
/// between 0 and `u32::MAX`. Fails with [`Error::Corrupt`] naming `origin`, the byte offset
/// of the first bad token and the token itself.
pub fn parse_token_text(text: &str, origin: &str) -> Result<Vec<u32>, Error> {
    // A lower bound on the count (ids are at least one digit and a separator) that avoids
    // most regrowth without a counting pass.
    let mut ids = Vec::with_capacity(text.len() / 6);
    for token in text.split_whitespace() {
        let offset = token.as_ptr() as usize - text.as_ptr() as usize;
        match token.parse::<u32>() {
            // `parse` accepts a leading '+'; an id is digits only.
            Ok(id) if token.as_bytes()[0].is_ascii_digit() => ids.push(id),
            _ => {
                return Err(Error::corrupt(
                    origin,
                    offset as u64,
                    bad_token_reason(token, ids.len()),
                ));
            }
        }
    }
    Ok(ids)
}

/// Why `token`, the `index`-th id, is not an id.
fn bad_token_reason(token: &str, index: usize) -> String {
    let quoted = quote(token);
    let digits = token.strip_prefix(['-', '+']).unwrap_or(token);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if token.starts_with('-') {
            format!("token {index} is {quoted}: token ids are non-negative integers")
        } else {
            format!(
                "token {index} is {quoted}: token ids must be at most {} (uint32)",
                u32::MAX
            )
        }
    } else {
        format!(
            "token {index} is {quoted}, not an integer id; pass decimal ids separated by \
             whitespace (no commas or brackets)"
        )
    }
}

/// `token` as a quoted string, cut to [`QUOTE_MAX`] characters.
fn quote(token: &str) -> String {
    match token.char_indices().nth(QUOTE_MAX) {
        Some((end, _)) => format!("{:?}...", &token[..end]),
        None => format!("{token:?}"),
    }
}

/// Reads token ids from an integer `.npy` array of any shape, flattened in C order.
///
/// Accepts every integer dtype; fails with [`Error::Corrupt`] naming `origin` if the file is
/// not a readable `.npy` array (see [`NpyHeader::parse`](chute_formats::NpyHeader::parse)), holds
/// floats or bools, or holds a value below 0 or above `u32::MAX` (naming its flat index,
/// value and byte offset).
pub fn token_ids_from_npy(bytes: &[u8], origin: &str) -> Result<Vec<u32>, Error> {
    let (header, data) = read_npy(bytes, origin)?;
    let data_offset = bytes.len() - data.len();
    let dtype = header.dtype();
    let out_of_range = |i: usize, value: i128| {
        Error::corrupt(
            origin,
            (data_offset + i * dtype.size()) as u64,
            format!(
                "token {i} is {value}: token ids must be between 0 and {} (uint32)",
                u32::MAX
            ),
        )
    };
    macro_rules! convert {
        ($t:ty) => {{
            const N: usize = size_of::<$t>();
            data.chunks_exact(N)
                .enumerate()
                .map(|(i, c)| {
                    let v = <$t>::from_le_bytes(c.try_into().expect("chunks of N bytes"));
                    u32::try_from(v).map_err(|_| out_of_range(i, v as i128))
                })
                .collect()
        }};
    }
    match dtype {
        DType::U8 => Ok(data.iter().map(|&b| u32::from(b)).collect()),
        DType::I8 => convert!(i8),
        DType::U16 => convert!(u16),
        DType::I16 => convert!(i16),
        DType::U32 => convert!(u32),
        DType::I32 => convert!(i32),
        DType::U64 => convert!(u64),
        DType::I64 => convert!(i64),
        other => Err(Error::corrupt(
            origin,
            data_offset as u64,
            format!(
                "the array holds {other}, but token ids are integers: save it with \
                 np.save(path, arr.astype(np.uint32))"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chute_core::npy::write_npy;
    use chute_formats::testing::corrupt;

    #[test]
    fn parses_whitespace_separated_ids() {
        let text = " 15496 11\t995\n\n0\r\n4294967295\u{a0}7 ";
        assert_eq!(
            parse_token_text(text, "t.txt").unwrap(),
            [15496, 11, 995, 0, u32::MAX, 7]
        );
        assert!(parse_token_text("", "t.txt").unwrap().is_empty());
        assert!(parse_token_text(" \n ", "t.txt").unwrap().is_empty());
    }

    #[test]
    fn bad_text_tokens_name_origin_offset_and_token() {
        let (uri, offset, r) = corrupt(parse_token_text("1 2 -3 4", "ids.txt").unwrap_err());
        assert_eq!((uri.as_str(), offset), ("ids.txt", 4));
        assert!(
            r.contains("token 2 is \"-3\"") && r.contains("non-negative"),
            "{r}"
        );

        let (_, offset, r) = corrupt(parse_token_text("1\n4294967296", "t").unwrap_err());
        assert_eq!(offset, 2);
        assert!(
            r.contains("\"4294967296\"") && r.contains("at most 4294967295"),
            "{r}"
        );

        let (_, offset, r) = corrupt(parse_token_text("7\u{a0}1, 2", "t").unwrap_err());
        assert_eq!(offset, 3);
        assert!(
            r.contains("token 1 is \"1,\"") && r.contains("no commas"),
            "{r}"
        );

        let (_, _, r) = corrupt(parse_token_text("+5", "t").unwrap_err());
        assert!(r.contains("\"+5\""), "{r}");

        let long = "x".repeat(1000);
        let (_, _, r) = corrupt(parse_token_text(&long, "t").unwrap_err());
        assert!(r.len() < 200, "{r}");
    }

    #[test]
    fn reads_integer_arrays_of_any_shape() {
        let data: Vec<u8> = [3i64, 0, 4_000_000_000, 7, 1, 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let file = write_npy(DType::I64, &[2, 3], &data).unwrap();
        assert_eq!(
            token_ids_from_npy(&file, "a.npy").unwrap(),
            [3, 0, 4_000_000_000, 7, 1, 2]
        );

        let file = write_npy(DType::U8, &[3], &[1, 2, 255]).unwrap();
        assert_eq!(token_ids_from_npy(&file, "a.npy").unwrap(), [1, 2, 255]);

        let data: Vec<u8> = [9u16, 65535].iter().flat_map(|v| v.to_le_bytes()).collect();
        let file = write_npy(DType::U16, &[2], &data).unwrap();
        assert_eq!(token_ids_from_npy(&file, "a.npy").unwrap(), [9, 65535]);

        let file = write_npy(DType::I32, &[0], &[]).unwrap();
        assert!(token_ids_from_npy(&file, "a.npy").unwrap().is_empty());
    }

    #[test]
    fn refuses_negative_large_and_float_values() {
        let data: Vec<u8> = [5i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let file = write_npy(DType::I32, &[2], &data).unwrap();
        let (uri, offset, r) = corrupt(token_ids_from_npy(&file, "neg.npy").unwrap_err());
        assert_eq!((uri.as_str(), offset), ("neg.npy", 128 + 4));
        assert!(r.contains("token 1 is -1"), "{r}");

        let data: Vec<u8> = [u64::MAX].iter().flat_map(|v| v.to_le_bytes()).collect();
        let file = write_npy(DType::U64, &[1], &data).unwrap();
        let (_, _, r) = corrupt(token_ids_from_npy(&file, "big.npy").unwrap_err());
        assert!(r.contains(&u64::MAX.to_string()), "{r}");

        let file = write_npy(DType::F32, &[1], &1.0f32.to_le_bytes()).unwrap();
        let (_, _, r) = corrupt(token_ids_from_npy(&file, "f.npy").unwrap_err());
        assert!(
            r.contains("float32") && r.contains("astype(np.uint32)"),
            "{r}"
        );

        let file = write_npy(DType::Bool, &[1], &[1]).unwrap();
        assert!(token_ids_from_npy(&file, "b.npy").is_err());

        assert!(token_ids_from_npy(b"1 2 3", "t.txt").is_err());
    }
}
