//! Files that appear whole or not at all: written under a temporary name, synced, renamed.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use chute_core::Error;

/// What [`AtomicFile::create`] adds to the final path to name the temporary file.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Bytes buffered before they go to the file: shard writers make many small writes (headers,
/// CRCs) between large ones.
const BUFFER: usize = 1 << 20;

/// A file written under a temporary name and moved to its final path only when complete, so
/// that an interrupted write (a crash, a killed job, a full disk) never leaves a file at the
/// final path that looks whole, and a reader that has the old file open or mapped keeps its
/// old bytes.
///
/// Bytes go through a buffer to the temporary file, `<path>.tmp` by default.
/// [`AtomicFile::finish`] flushes it, syncs the data to disk (without the sync, a crash soon
/// after the rename can leave the complete-looking name over missing data on some file
/// systems), renames it to the final path and syncs the folder, so that the rename itself
/// survives a crash. Dropping the file without finishing it deletes the temporary file.
///
/// Writing goes through [`Write`], whose errors carry no path; [`AtomicFile::error`] names
/// the temporary file in chute's [`Error::Io`]. Errors of [`AtomicFile`]'s own methods name
/// the temporary file, or the final path when the rename fails.
///
/// ```
/// use std::io::Write;
/// use chute_io::AtomicFile;
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("labels.txt");
/// let mut file = AtomicFile::create(&path)?;
/// file.write_all(b"cat\ndog\n")?;
/// assert!(!path.exists()); // still under its temporary name
/// assert!(dir.path().join("labels.txt.tmp").exists());
/// assert_eq!(file.finish()?, 8);
/// assert_eq!(std::fs::read(&path)?, b"cat\ndog\n");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    temp: PathBuf,
    /// `None` once finished.
    out: Option<BufWriter<File>>,
    written: u64,
}

impl AtomicFile {
    /// Creates (or truncates) `<path>.tmp`, to become `path` when finished. Fails with
    /// [`Error::Io`] naming the temporary file if it cannot be created.
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile, Error> {
        let path = path.as_ref();
        let mut temp = path.as_os_str().to_owned();
        temp.push(TEMP_SUFFIX);
        AtomicFile::create_with_temp(path, temp)
    }

    /// [`AtomicFile::create`] with the temporary file at `temp` instead of `<path>.tmp`: for
    /// writers that need a name no other process uses for the same path. `temp` must be on
    /// the file system of `path` (in its folder, say), or the rename fails.
    pub fn create_with_temp(
        path: impl AsRef<Path>,
        temp: impl AsRef<Path>,
    ) -> Result<AtomicFile, Error> {
        let temp = temp.as_ref().to_path_buf();
        let file = File::create(&temp).map_err(|e| Error::io(temp.display().to_string(), e))?;
        Ok(AtomicFile {
            path: path.as_ref().to_path_buf(),
            temp,
            out: Some(BufWriter::with_capacity(BUFFER, file)),
            written: 0,
        })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file's path.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// `e`, an error of writing to this file, as an [`Error::Io`] naming the temporary file.
    pub fn error(&self, e: io::Error) -> Error {
        Error::io(self.temp.display().to_string(), e)
    }

    /// Flushes and syncs the bytes, renames the temporary file to the final path (replacing
    /// any file there) and syncs the folder; returns the file's length in bytes.
    ///
    /// Fails with [`Error::Io`] naming the temporary file if flushing or syncing fails, the
    /// final path if the rename fails (the temporary file is deleted in both cases), or the
    /// folder if syncing it fails (the file is then in place, but the rename may not survive
    /// a crash).
    pub fn finish(mut self) -> Result<u64, Error> {
        let out = self.out.take().expect("finish consumes the file");
        let synced = out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)
            .and_then(|file| file.sync_all());
        if let Err(e) = synced {
            let _ = fs::remove_file(&self.temp);
            return Err(self.error(e));
        }
        if let Err(e) = fs::rename(&self.temp, &self.path) {
            let _ = fs::remove_file(&self.temp);
            return Err(Error::io(self.path.display().to_string(), e));
        }
        sync_folder(&self.path)?;
        Ok(self.written)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out().write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out().write_all(buf)?;
        self.written += buf.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out().flush()
    }
}

impl AtomicFile {
    fn out(&mut self) -> &mut BufWriter<File> {
        self.out.as_mut().expect("finish consumes the file")
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(out) = self.out.take() {
            // Not finished: the partial file must not stay behind (and its buffered bytes
            // need not be written first).
            drop(out.into_parts());
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Writes `bytes` to `path` through an [`AtomicFile`]: readers see the old file or the whole
/// new one, never part of it. Fails as [`AtomicFile::finish`] does, or with [`Error::Io`]
/// naming the temporary file if it cannot be created or written.
pub fn write_atomically(path: impl AsRef<Path>, bytes: &[u8]) -> Result<(), Error> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(|e| file.error(e))?;
    file.finish()?;
    Ok(())
}

/// Syncs the folder holding `path`, so that a rename into it is on disk. Folders cannot be
/// opened as files on Windows, whose renames need no such sync.
/// `EINVAL` and `ENOTSUP` on Linux (and most Unixes): what a file system that cannot sync a
/// folder answers.
const EINVAL: i32 = 22;
const ENOTSUP: i32 = 95;

fn sync_folder(path: &Path) -> Result<(), Error> {
    if cfg!(unix) {
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        match File::open(folder).and_then(|f| f.sync_all()) {
            Ok(()) => {}
            // Some file systems (FUSE, network mounts) cannot sync a folder: the file is in
            // place, only the rename's durability across a crash is theirs to give.
            Err(e) if matches!(e.raw_os_error(), Some(code) if code == EINVAL || code == ENOTSUP) =>
                {}
            Err(e) => return Err(Error::io(folder.display().to_string(), e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn finish_renames_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        fs::write(&path, b"old").unwrap();
        let mut f = AtomicFile::create(&path).unwrap();
        assert_eq!(f.path(), path);
        assert_eq!(f.temp_path(), dir.path().join("a.bin.tmp"));
        // More than the buffer, in small and large writes.
        let big = vec![7u8; BUFFER + 10];
        f.write_all(b"new ").unwrap();
        f.write_all(&big).unwrap();
        assert_eq!(f.written(), 4 + big.len() as u64);
        // Until finished, readers see the old file.
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["a.bin", "a.bin.tmp"]);
        assert_eq!(f.finish().unwrap(), 4 + big.len() as u64);
        assert_eq!(fs::read(&path).unwrap(), [&b"new "[..], &big].concat());
        assert_eq!(names(dir.path()), ["a.bin"]);

        write_atomically(&path, b"again").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"again");
        assert_eq!(names(dir.path()), ["a.bin"]);
        // A path without a folder part is in the working directory's folder.
        assert!(sync_folder(Path::new("relative-name")).is_ok());
    }

    #[test]
    fn drop_without_finish_removes_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        fs::write(&path, b"old").unwrap();
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(&[1; 100]).unwrap();
        f.flush().unwrap();
        drop(f);
        assert_eq!(names(dir.path()), ["a.bin"]);
        assert_eq!(fs::read(&path).unwrap(), b"old");

        // With a temporary name of the caller's choice.
        let temp = dir.path().join("a.bin.1234.part");
        let mut f = AtomicFile::create_with_temp(&path, &temp).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(f.temp_path(), temp);
        assert_eq!(names(dir.path()), ["a.bin", "a.bin.1234.part"]);
        drop(f);
        assert_eq!(names(dir.path()), ["a.bin"]);
        let mut f = AtomicFile::create_with_temp(&path, &temp).unwrap();
        f.write_all(b"x").unwrap();
        f.finish().unwrap();
        assert_eq!(names(dir.path()), ["a.bin"]);
        assert_eq!(fs::read(&path).unwrap(), b"x");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/a.bin");
        let e = AtomicFile::create(&missing).unwrap_err();
        match &e {
            Error::Io { path, source } => {
                assert!(path.ends_with("a.bin.tmp"), "{e}");
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected an I/O error, got {other}"),
        }
        assert!(write_atomically(&missing, b"x").is_err());
        // A rename onto a folder fails, naming the final path, and leaves nothing behind.
        let folder = dir.path().join("taken");
        fs::create_dir(&folder).unwrap();
        fs::write(folder.join("inside"), b"").unwrap();
        let mut f = AtomicFile::create(&folder).unwrap();
        f.write_all(b"x").unwrap();
        let e = f.finish().unwrap_err();
        assert!(
            matches!(&e, Error::Io { path, .. } if *path == folder.display().to_string()),
            "{e}"
        );
        assert_eq!(names(dir.path()), ["taken"]);
        // Write errors, through `error`, name the temporary file.
        let f = AtomicFile::create(dir.path().join("b.bin")).unwrap();
        let e = f.error(io::Error::other("disk full"));
        assert!(
            matches!(&e, Error::Io { path, .. } if path.ends_with("b.bin.tmp")),
            "{e}"
        );
    }
}
