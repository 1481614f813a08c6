//! Folder input in ImageFolder layout: `root/<class>/<name>.<ext>`; files sharing a name up to
//! the first dot form one sample, the class folder's position in sorted order its label.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};

use super::infer::{Column, Kind, Value};
use super::{Input, Row};

/// One sample of a folder: its key (`<class>/<name>`), label and files by field.
#[derive(Debug)]
struct FolderSample {
    key: String,
    label: i64,
    files: Vec<(String, PathBuf)>,
}

/// A folder in ImageFolder layout.
#[derive(Debug)]
pub(super) struct FolderInput {
    samples: Vec<FolderSample>,
    columns: Vec<Column>,
}

impl FolderInput {
    /// Lists `root`: the class folders in sorted order, the files under each grouped into samples.
    pub(super) fn open(root: &Path) -> anyhow::Result<FolderInput> {
        let mut classes: Vec<String> = Vec::new();
        for entry in
            std::fs::read_dir(root).with_context(|| format!("listing {}", root.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", root.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && !name.starts_with('.') {
                classes.push(name);
            }
        }
        classes.sort();
        ensure!(
            !classes.is_empty(),
            "{} has no class folders; the ImageFolder layout is <root>/<class>/<file>",
            root.display()
        );
        let mut samples: Vec<FolderSample> = Vec::new();
        let mut fields: Vec<String> = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut files = Vec::new();
            walk(&root.join(class), class, &mut files)?;
            files.sort();
            for (rel, path) in files {
                // The WebDataset rule: the key is the path up to the first dot of the file
                // name, the rest (lower-cased) names the field.
                let (dir, file) = rel.rsplit_once('/').expect("under a class folder");
                let Some((stem, ext)) = file.split_once('.') else {
                    bail!(
                        "{}: a file name without an extension; name files <name>.<ext> (the \
                         extension names the field)",
                        path.display()
                    );
                };
                ensure!(
                    !stem.is_empty() && !ext.is_empty(),
                    "{}: the name needs text before and after its first dot",
                    path.display()
                );
                let key = format!("{dir}/{stem}");
                let ext = ext.to_lowercase();
                ensure!(
                    ext != "cls",
                    "{}: the field `cls` holds the label; rename the file",
                    path.display()
                );
                if !fields.contains(&ext) {
                    fields.push(ext.clone());
                }
                match samples.last_mut() {
                    Some(s) if s.key == key => {
                        ensure!(
                            !s.files.iter().any(|(e, _)| *e == ext),
                            "{}: two files give sample {key:?} field {ext:?}",
                            path.display()
                        );
                        s.files.push((ext, path));
                    }
                    _ => samples.push(FolderSample {
                        key,
                        label: label as i64,
                        files: vec![(ext, path)],
                    }),
                }
            }
        }
        fields.sort();
        let mut columns: Vec<Column> = fields
            .into_iter()
            .map(|name| Column {
                name,
                kind: Kind::Bytes,
                missing: false,
            })
            .collect();
        for c in &mut columns {
            c.missing = samples
                .iter()
                .any(|s| !s.files.iter().any(|(e, _)| *e == c.name));
        }
        columns.push(Column {
            name: "cls".into(),
            kind: Kind::Int,
            missing: false,
        });
        Ok(FolderInput { samples, columns })
    }
}

/// Files under `dir` (recursively, hidden ones skipped) as (`rel/path`, full path).
fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, PathBuf)>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let rel = format!("{rel}/{name}");
        if path.is_dir() {
            walk(&path, &rel, out)?;
        } else {
            out.push((rel, path));
        }
    }
    Ok(())
}

impl Input for FolderInput {
    fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    fn columns(&self) -> &[Column] {
        &self.columns
    }

    fn read(
        &self,
        range: Range<u64>,
        out: &mut dyn FnMut(Row) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for s in &self.samples[range.start as usize..range.end as usize] {
            let mut values = Vec::with_capacity(self.columns.len());
            for c in &self.columns[..self.columns.len() - 1] {
                values.push(match s.files.iter().find(|(e, _)| *e == c.name) {
                    Some((_, path)) => Value::Bytes(
                        std::fs::read(path)
                            .with_context(|| format!("reading {}", path.display()))?
                            .into(),
                    ),
                    None => Value::Missing,
                });
            }
            values.push(Value::Int(s.label));
            out(Row {
                key: s.key.clone(),
                values,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testing::{columns, rows, write};

    #[test]
    fn samples_group_by_name_and_label_by_sorted_class() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "dog/1.JPG", b"d1");
        write(root, "dog/1.txt", b"one");
        write(root, "cat/sub/2.seg.png", b"c2");
        write(root, "cat/.hidden.jpg", b"no");
        write(root, ".git/x.jpg", b"no");
        let input = FolderInput::open(root).unwrap();
        assert_eq!(
            columns(&input),
            [
                ("jpg", Kind::Bytes, true),
                ("seg.png", Kind::Bytes, true),
                ("txt", Kind::Bytes, true),
                ("cls", Kind::Int, false),
            ]
        );
        assert_eq!(
            rows(&input, 2),
            [
                (
                    "cat/sub/2".into(),
                    r#"[Missing, Bytes(b"c2"), Missing, Int(0)]"#.into()
                ),
                (
                    "dog/1".into(),
                    r#"[Bytes(b"d1"), Missing, Bytes(b"one"), Int(1)]"#.into()
                ),
            ]
        );
    }

    #[test]
    fn names_need_an_extension_and_cls_is_the_label() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a/noext", b"");
        let err = FolderInput::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("without an extension"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a/x.cls", b"");
        let err = FolderInput::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("holds the label"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = FolderInput::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("no class folders"), "{err}");
    }
}
