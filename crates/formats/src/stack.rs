//! [`Stack`]: numeric columns stacked into one `[B, k]` column, and [`parse_stack`], the
//! CLI's and Python's way to name one.

use crate::expand_braces;

/// Columnar columns (Parquet, Arrow) stacked side by side into one column: `(name,
/// members)`. The members, numeric scalars or fixed-size lists of one dtype, leave the batch;
/// `name`, a `[B, k]` tensor (`k` their total width, members in the order given), takes the
/// first member's place. A model's feature matrix this way comes out of the workers whole
/// instead of being stacked from `k` columns on the training thread.
pub type Stack = Vec<(String, Vec<String>)>;

/// `NAME=COL,COL,...` (the CLI's `--stack`) as one [`Stack`] entry; the member list may use
/// brace patterns (`x=f{0..15}` stacks `f0` to `f15`).
///
/// ```
/// use chute_formats::parse_stack;
/// let (name, cols) = parse_stack("x=f{0..2},g{a,b},h")?;
/// assert_eq!(name, "x");
/// assert_eq!(cols, ["f0", "f1", "f2", "ga", "gb", "h"]);
/// assert!(parse_stack("x").is_err() && parse_stack("=a").is_err() && parse_stack("x=").is_err());
/// # Ok::<(), chute_core::ConfigError>(())
/// ```
pub fn parse_stack(spec: &str) -> Result<(String, Vec<String>), chute_core::ConfigError> {
    let bad = |why: &str| {
        chute_core::ConfigError::new(
            "stack",
            format!("{spec:?}: {why}; write NAME=COL,COL,... (e.g. x=f{{0..15}})"),
        )
    };
    let (name, members) = spec.split_once('=').ok_or_else(|| bad("no `=`"))?;
    if name.is_empty() {
        return Err(bad("no name before `=`"));
    }
    // Commas separate columns, except inside a brace pattern (`f{0,2}`).
    let mut cols = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, ch) in members.char_indices().chain([(members.len(), ',')]) {
        match ch {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                if i > start {
                    cols.extend(expand_braces(&members[start..i])?);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if cols.is_empty() {
        return Err(bad("no columns after `=`"));
    }
    Ok((name.to_string(), cols))
}
