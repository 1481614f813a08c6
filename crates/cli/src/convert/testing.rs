//! What the inputs' tests share: writing input files, and an input's columns and rows in a
//! form to compare.

use std::path::{Path, PathBuf};

use super::Input;
use super::infer::Kind;

/// `body` written to `dir/name` (folders created); its path.
pub(super) fn write(dir: &Path, name: &str, body: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().expect("under dir")).unwrap();
    std::fs::write(&path, body).unwrap();
    path
}

/// Each column's name, kind and whether some row lacks it.
pub(super) fn columns(input: &dyn Input) -> Vec<(&str, Kind, bool)> {
    input
        .columns()
        .iter()
        .map(|c| (c.name.as_str(), c.kind, c.missing))
        .collect()
}

/// Every row of `input`, read shard by shard as `convert` does, as (key, values in Debug
/// form).
pub(super) fn rows(input: &dyn Input, shard_size: u64) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    for lo in (0..input.len()).step_by(shard_size as usize) {
        let hi = (lo + shard_size).min(input.len());
        input
            .read(lo..hi, &mut |r| {
                rows.push((r.key, format!("{:?}", r.values)));
                Ok(())
            })
            .unwrap();
    }
    rows
}
