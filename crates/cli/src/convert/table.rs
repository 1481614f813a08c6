//! Text files read as one table, a row at a time (CSV, JSON Lines): the first pass notes where
//! each shard's first row starts, so a shard's job seeks there instead of reading every row
//! before it.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};

/// One text file's rows, in order.
pub(super) trait RowReader {
    /// A row as the format reads it (a CSV record, a line of JSON), borrowed from the reader.
    type Item<'a>
    where
        Self: 'a;

    /// The next row and the byte of the file where it starts, or `None` at the end of the file.
    /// `row` is the row's number in the table, counted from 0, for messages.
    fn next_row(&mut self, row: u64) -> anyhow::Result<Option<(u64, Self::Item<'_>)>>;
}

/// Where a row starts: which file, and the byte in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    file: usize,
    byte: u64,
}

/// Text files read as one table, in the order given, split into shards of `shard_size` rows.
#[derive(Debug)]
pub(super) struct TextTable {
    files: Vec<PathBuf>,
    shard_size: u64,
    rows: u64,
    /// Where rows `k * shard_size` start.
    starts: Vec<Position>,
}

impl TextTable {
    /// A table of `files` with no rows yet: the first pass [`push`](Self::push)es them.
    pub(super) fn new(files: Vec<PathBuf>, shard_size: u64) -> TextTable {
        TextTable {
            files,
            shard_size,
            rows: 0,
            starts: Vec::new(),
        }
    }

    /// Adds the next row, which starts at `byte` of file `file` (an index into the files).
    pub(super) fn push(&mut self, file: usize, byte: u64) {
        if self.rows.is_multiple_of(self.shard_size) {
            self.starts.push(Position { file, byte });
        }
        self.rows += 1;
    }

    /// Rows in all.
    pub(super) fn rows(&self) -> u64 {
        self.rows
    }

    /// Calls `each(row, path, byte, item)` with rows `range`, in order; `range` starts a shard.
    /// `open(path, Some(byte))` opens the shard's first file at `byte`, where a row starts;
    /// `open(path, None)` opens each next file at its first row (after any header).
    pub(super) fn read<R: RowReader>(
        &self,
        range: Range<u64>,
        mut open: impl FnMut(&Path, Option<u64>) -> anyhow::Result<R>,
        mut each: impl FnMut(u64, &Path, u64, R::Item<'_>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        debug_assert!(range.start.is_multiple_of(self.shard_size));
        let start = self.starts[(range.start / self.shard_size) as usize];
        let mut row = range.start;
        let mut file = start.file;
        let mut at = Some(start.byte);
        while row < range.end {
            ensure!(
                file < self.files.len(),
                "the input ended before row {}: was it changed during the convert?",
                range.end
            );
            let path = &self.files[file];
            let mut reader = open(path, at.take())?;
            while row < range.end {
                let Some((byte, item)) = reader.next_row(row)? else {
                    break;
                };
                each(row, path, byte, item)?;
                row += 1;
            }
            file += 1;
        }
        Ok(())
    }
}

/// `path`, opened and positioned at `byte`.
pub(super) fn open_at(path: &Path, byte: u64) -> anyhow::Result<File> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.seek(SeekFrom::Start(byte))
        .with_context(|| format!("seeking in {}", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    /// Rows are lines; a file may start with a header line, which a reader opened at the
    /// file's first row skips.
    struct TestLines {
        reader: BufReader<File>,
        byte: u64,
        line: String,
    }

    impl TestLines {
        fn open(path: &Path, at: Option<u64>, header: bool) -> anyhow::Result<TestLines> {
            let mut lines = TestLines {
                reader: BufReader::new(open_at(path, at.unwrap_or(0))?),
                byte: at.unwrap_or(0),
                line: String::new(),
            };
            if at.is_none() && header {
                lines.next_row(0)?;
            }
            Ok(lines)
        }
    }

    impl RowReader for TestLines {
        type Item<'a> = &'a str;

        fn next_row(&mut self, _row: u64) -> anyhow::Result<Option<(u64, &str)>> {
            self.line.clear();
            let start = self.byte;
            let n = self.reader.read_line(&mut self.line)?;
            self.byte += n as u64;
            Ok((n > 0).then(|| (start, self.line.trim_end())))
        }
    }

    /// Files under `dir` holding `contents`, one each, named by their index.
    fn files(dir: &Path, contents: &[&str]) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for (i, body) in contents.iter().enumerate() {
            let path = dir.join(format!("{i}.txt"));
            std::fs::write(&path, body).unwrap();
            paths.push(path);
        }
        paths
    }

    /// The first pass over `files`, as CSV and JSON Lines do it.
    fn scan(files: &[PathBuf], shard_size: u64, header: bool) -> TextTable {
        let mut table = TextTable::new(files.to_vec(), shard_size);
        for (file, path) in files.iter().enumerate() {
            let mut lines = TestLines::open(path, None, header).unwrap();
            while let Some((byte, _)) = lines.next_row(table.rows()).unwrap() {
                table.push(file, byte);
            }
        }
        table
    }

    /// Shard by shard, (row number, file name, byte, row) of every row `read` gives.
    fn read_all(table: &TextTable, header: bool) -> Vec<Vec<(u64, String, u64, String)>> {
        (0..table.rows())
            .step_by(table.shard_size as usize)
            .map(|lo| {
                let mut rows = Vec::new();
                let range = lo..(lo + table.shard_size).min(table.rows());
                table
                    .read(
                        range,
                        |path, at| TestLines::open(path, at, header),
                        |row, path, byte, line| {
                            let name = path.file_name().unwrap().to_string_lossy().into_owned();
                            rows.push((row, name, byte, line.to_owned()));
                            Ok(())
                        },
                    )
                    .unwrap();
                rows
            })
            .collect()
    }

    fn row(n: u64, file: &str, byte: u64, text: &str) -> (u64, String, u64, String) {
        (n, file.into(), byte, text.into())
    }

    #[test]
    fn shards_start_where_their_first_row_is_even_in_a_later_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path(), &["a\nbb\nccc\n", "", "d\nee\n"]);
        let table = scan(&files, 2, false);
        assert_eq!(table.rows(), 5);
        let at = |file, byte| Position { file, byte };
        assert_eq!(table.starts, [at(0, 0), at(0, 5), at(2, 2)]);
        assert_eq!(
            read_all(&table, false),
            [
                vec![row(0, "0.txt", 0, "a"), row(1, "0.txt", 2, "bb")],
                // A shard runs on into the next file, past an empty one.
                vec![row(2, "0.txt", 5, "ccc"), row(3, "2.txt", 0, "d")],
                vec![row(4, "2.txt", 2, "ee")],
            ]
        );
    }

    #[test]
    fn a_shard_that_goes_on_into_the_next_file_skips_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path(), &["h\n1\n22\n333\n", "h\n4\n", "h\n"]);
        let table = scan(&files, 3, true);
        assert_eq!(table.rows(), 4);
        let at = |file, byte| Position { file, byte };
        assert_eq!(table.starts, [at(0, 2), at(1, 2)]);
        assert_eq!(
            read_all(&table, true),
            [
                vec![
                    row(0, "0.txt", 2, "1"),
                    row(1, "0.txt", 4, "22"),
                    row(2, "0.txt", 7, "333")
                ],
                vec![row(3, "1.txt", 2, "4")],
            ]
        );
        // One shard of all the rows: from the first file's first row through the second's.
        let one = scan(&files, 10, true);
        assert_eq!(one.starts, [at(0, 2)]);
        assert_eq!(read_all(&one, true)[0].len(), 4);
    }

    #[test]
    fn a_shard_past_the_end_of_the_files_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path(), &["a\nb\nc\n"]);
        let table = scan(&files, 2, false);
        // As if the file had lost a row since the first pass.
        std::fs::write(&files[0], "a\nb\n").unwrap();
        let err = table
            .read(
                2..3,
                |path, at| TestLines::open(path, at, false),
                |_, _, _, _| Ok(()),
            )
            .unwrap_err();
        assert!(err.to_string().contains("ended before row 3"), "{err}");
    }
}
