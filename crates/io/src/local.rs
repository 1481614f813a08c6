//! Local files: [`MappedFile`], a read-only memory map with zero-copy views, and
//! [`LocalFile`], positioned reads without a shared cursor.

use std::fmt;
use std::fs::{File, Metadata};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::maps::{self, Map};
use bytes::Bytes;
use chute_core::Error;

/// A local file mapped read-only into memory.
///
/// Reading a sample is a slice of the map: [`MappedFile::bytes`] returns a [`Bytes`] view that
/// shares ownership of the map, so a view stays valid after the `MappedFile` (and every clone
/// of it) is dropped, and no bytes are copied until the batcher copies them into the batch.
/// The operating system pages data in on first touch and evicts it under memory pressure, so a
/// file larger than RAM works; call [`MappedFile::advise_random`] when samples are read in
/// shuffled order so the kernel does not read ahead pages nobody asked for.
///
/// Cloning is cheap (a reference count) and clones share the map. So do files opened again
/// while it is in use or soon after: the process keeps one map per file (device, inode and
/// length), and a map whose last view is dropped rests a minute before it is unmapped, so a
/// source built again on the same files (each epoch, say) reads through pages already mapped
/// and dropping one costs no unmapping (see the `maps` module). An empty file is not mapped
/// (`mmap(2)` refuses zero-length maps) and behaves as an empty slice.
#[derive(Clone)]
pub struct MappedFile {
    path: PathBuf,
    /// `None` for an empty file.
    map: Option<Arc<Map>>,
    /// A view of the whole map: [`MappedFile::bytes`] slices it, which costs one atomic
    /// increment and no allocation per call.
    all: Bytes,
}

/// Lets a [`Bytes`] share ownership of the map.
struct MapOwner(Arc<Map>);

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.mmap()
    }
}

impl MappedFile {
    /// Opens `path` read-only and maps the whole file.
    ///
    /// Fails with [`Error::Io`] naming the path if the file cannot be opened, is not a regular
    /// file, does not fit in the address space or cannot be mapped.
    pub fn open(path: impl AsRef<Path>) -> Result<MappedFile, Error> {
        Self::open_with(path.as_ref(), true)
    }

    /// Opens `path` read-only and maps the whole file for this caller alone: the map is not
    /// shared with other opens of the file, and is unmapped as soon as its last view is
    /// dropped. For files about to be deleted to free their space (a resting map would keep
    /// it a minute longer): the node-local cache's entries.
    pub fn open_unshared(path: impl AsRef<Path>) -> Result<MappedFile, Error> {
        Self::open_with(path.as_ref(), false)
    }

    fn open_with(path: &Path, shared: bool) -> Result<MappedFile, Error> {
        let (file, meta) = open_regular(path)?;
        let len = meta.len();
        let len = usize::try_from(len).map_err(|_| {
            io_error(
                path,
                io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    format!(
                        "the file's {len} bytes do not fit in this platform's address space; \
                         use a 64-bit build"
                    ),
                ),
            )
        })?;
        // An empty file is not mapped: mmap(2) refuses zero-length maps.
        let map = if len == 0 {
            None
        } else {
            Some(maps::map(&file, &meta, len, shared).map_err(|e| io_error(path, e))?)
        };
        let all = match &map {
            Some(m) => Bytes::from_owner(MapOwner(Arc::clone(m))),
            None => Bytes::new(),
        };
        Ok(MappedFile {
            path: path.to_path_buf(),
            map,
            all,
        })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the file in bytes, as it was when opened.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// The whole file as a slice of the map.
    pub fn as_slice(&self) -> &[u8] {
        &self.all
    }

    /// A zero-copy view of `range` that keeps the map alive as long as it lives.
    ///
    /// # Panics
    /// If `range` is decreasing or ends past [`MappedFile::len`], as slicing does; readers that
    /// take a range from the data use [`MappedFile::get_bytes`] and report corruption instead.
    pub fn bytes(&self, range: Range<usize>) -> Bytes {
        self.all.slice(range)
    }

    /// A zero-copy view of `range`, or `None` if the range is decreasing or ends past
    /// [`MappedFile::len`].
    pub fn get_bytes(&self, range: Range<usize>) -> Option<Bytes> {
        (range.start <= range.end && range.end <= self.len()).then(|| self.all.slice(range))
    }

    /// Bytes of the file the page cache holds now (`mincore(2)`): reading the rest touches
    /// the disk. `None` where the platform cannot tell.
    pub fn resident_bytes(&self) -> Option<u64> {
        #[cfg(unix)]
        {
            let map = self.map.as_ref()?.mmap();
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .ok()
                .filter(|&p| p > 0)?;
            let mut pages = vec![0u8; map.len().div_ceil(page)];
            // SAFETY: the map is `map.len()` bytes from a page-aligned address, and `pages` has
            // one byte per page of it, as mincore(2) requires.
            let rc = unsafe {
                libc::mincore(
                    map.as_ptr() as *mut libc::c_void,
                    map.len(),
                    pages.as_mut_ptr().cast(),
                )
            };
            if rc != 0 {
                return None;
            }
            let resident = pages.iter().filter(|&&p| p & 1 == 1).count();
            Some(((resident * page) as u64).min(map.len() as u64))
        }
        #[cfg(not(unix))]
        {
            None
        }
    }

    /// Tells the kernel that pages will be touched in random order, so it does not read
    /// ahead. A hint: failures, and platforms without `madvise`, are ignored.
    pub fn advise_random(&self) {
        #[cfg(unix)]
        self.advise(memmap2::Advice::Random);
    }

    /// Tells the kernel that pages will be read in order, so it reads ahead aggressively. A
    /// hint: failures, and platforms without `madvise`, are ignored.
    pub fn advise_sequential(&self) {
        #[cfg(unix)]
        self.advise(memmap2::Advice::Sequential);
    }

    /// Tells the kernel to read ahead as it does by default, taking back an earlier
    /// [`MappedFile::advise_random`] or [`MappedFile::advise_sequential`]: the map may be one
    /// another source of the same file advised (see the type's docs). A hint, as those are.
    pub fn advise_normal(&self) {
        #[cfg(unix)]
        self.advise(memmap2::Advice::Normal);
    }

    #[cfg(unix)]
    fn advise(&self, advice: memmap2::Advice) {
        if let Some(map) = &self.map {
            // Only a hint: a kernel that refuses it reads the same bytes, just less well.
            let _ = map.mmap().advise(advice);
        }
    }
}

impl fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the bytes: a shard can be gigabytes.
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.len())
            .finish()
    }
}

/// A local file read with positioned reads (`pread`): no shared cursor, so one `LocalFile`
/// can serve every worker thread at once.
///
/// Use it for formats that read small pieces (an index, a footer, one record) of files where
/// mapping the whole file is not wanted; [`MappedFile`] is the zero-copy choice otherwise.
#[derive(Debug)]
pub struct LocalFile {
    path: PathBuf,
    file: File,
    len: u64,
}

impl LocalFile {
    /// Opens `path` read-only.
    ///
    /// Fails with [`Error::Io`] naming the path if the file cannot be opened or is not a
    /// regular file.
    pub fn open(path: impl AsRef<Path>) -> Result<LocalFile, Error> {
        let path = path.as_ref();
        let (file, meta) = open_regular(path)?;
        Ok(LocalFile {
            path: path.to_path_buf(),
            file,
            len: meta.len(),
        })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the file in bytes, as it was when opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read, `0` at the end
    /// of the file. Retries reads interrupted by a signal.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        loop {
            match pread(&self.file, offset, buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => {
                    return r.map_err(|e| {
                        io_error(
                            &self.path,
                            io::Error::new(
                                e.kind(),
                                format!("reading {} bytes at byte {offset}: {e}", buf.len()),
                            ),
                        )
                    });
                }
            }
        }
    }

    /// Fills `buf` with the bytes at `offset`. Fails with [`Error::Io`] of kind
    /// `UnexpectedEof`, naming the offset and the file's end, if the file ends first.
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(offset + done as u64, &mut buf[done..])?;
            if n == 0 {
                return Err(io_error(
                    &self.path,
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "reading {} bytes at byte {offset}: the file ends at byte {}; it \
                             is shorter than the index or header says (truncated?)",
                            buf.len(),
                            offset + done as u64
                        ),
                    ),
                ));
            }
            done += n;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn pread(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
fn pread(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    // seek_read moves the handle's cursor, but nothing here uses the cursor.
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

#[cfg(not(any(unix, windows)))]
fn pread(_file: &File, _offset: u64, _buf: &mut [u8]) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "positioned reads are not supported on this platform",
    ))
}

/// Opens `path` read-only and checks that it is a regular file; returns it with its metadata.
fn open_regular(path: &Path) -> Result<(File, Metadata), Error> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(io_error(
            path,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("is {what}; pass the shard files themselves"),
            ),
        ));
    }
    Ok((file, meta))
}

fn io_error(path: &Path, e: io::Error) -> Error {
    Error::io(path.display().to_string(), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn views_outlive_the_file_handle() {
        let data: Vec<u8> = (0..=255).collect();
        let (_dir, path) = file_with(&data);
        let f = MappedFile::open(&path).unwrap();
        assert_eq!(f.path(), path);
        assert_eq!(f.len(), 256);
        assert!(!f.is_empty());
        assert_eq!(f.as_slice(), &data[..]);
        f.advise_random();
        f.advise_sequential();
        f.advise_normal();
        let view = f.bytes(10..20);
        let clone = f.clone();
        drop(f);
        assert_eq!(&view[..], &data[10..20]);
        assert_eq!(clone.as_slice().as_ptr(), clone.bytes(0..1).as_ptr());
        drop(clone);
        assert_eq!(&view[..], &data[10..20]);
    }

    #[test]
    fn a_file_opened_again_shares_its_map_in_use_or_resting() {
        let (dir, path) = file_with(b"0123456789");
        let addr = |f: &MappedFile| f.as_slice().as_ptr() as usize;
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        let a = MappedFile::open(&path).unwrap();
        let b = MappedFile::open(&path).unwrap();
        assert_eq!(addr(&a), addr(&b), "in use: one map");
        let at = addr(&a);
        let view = a.bytes(2..4);
        drop((a, b));
        assert!(!maps::resting(&meta(&path)), "a view still uses the map");
        drop(view);
        assert!(maps::resting(&meta(&path)));
        let c = MappedFile::open(&path).unwrap();
        assert_eq!(addr(&c), at, "the resting map is taken back");
        assert!(!maps::resting(&meta(&path)));

        // Bytes written in place show through the shared map, as through a new one.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"ab"))
            .unwrap();
        assert_eq!(MappedFile::open(&path).unwrap().as_slice(), b"ab23456789");
        // A new length is a new map; so is a new file renamed into place.
        drop(c);
        std::fs::write(&path, b"longer than before").unwrap();
        let d = MappedFile::open(&path).unwrap();
        assert_eq!(d.as_slice(), b"longer than before");
        let other = dir.path().join("g.bin");
        std::fs::write(&other, b"renamed in place!!").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let e = MappedFile::open(&path).unwrap();
        assert_eq!(e.as_slice(), b"renamed in place!!");
        assert_ne!(addr(&d), addr(&e));
        drop((d, e));

        // An unshared map is its caller's alone and never rests.
        let u = MappedFile::open_unshared(&path).unwrap();
        let again = MappedFile::open(&path).unwrap();
        assert_ne!(addr(&u), addr(&again));
        assert_eq!(u.as_slice(), again.as_slice());
        drop((u, again));
        let p = dir.path().join("u.bin");
        std::fs::write(&p, b"unshared").unwrap();
        drop(MappedFile::open_unshared(&p).unwrap());
        assert!(!maps::resting(&meta(&p)));

        // At most maps::RESTING rest, the oldest unmapped first; and none past maps::REST.
        let files: Vec<PathBuf> = (0..maps::RESTING + 1)
            .map(|i| {
                let p = dir.path().join(format!("r{i}.bin"));
                std::fs::write(&p, [i as u8; 3]).unwrap();
                p
            })
            .collect();
        for p in &files {
            drop(MappedFile::open(p).unwrap());
        }
        assert!(!maps::resting(&meta(&files[0])));
        let last = meta(files.last().unwrap());
        assert!(maps::resting(&last));
        maps::expire_at(std::time::Instant::now() + maps::REST);
        assert!(!maps::resting(&last));
    }

    #[test]
    fn get_bytes_checks_the_range() {
        let (_dir, path) = file_with(b"abcdef");
        let f = MappedFile::open(&path).unwrap();
        assert_eq!(&f.get_bytes(2..6).unwrap()[..], b"cdef");
        assert_eq!(f.get_bytes(6..6).unwrap().len(), 0);
        assert!(f.get_bytes(2..7).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 4..2;
        assert!(f.get_bytes(backwards).is_none());
    }

    #[test]
    fn empty_file_is_not_mapped() {
        let (_dir, path) = file_with(b"");
        let f = MappedFile::open(&path).unwrap();
        assert!(f.is_empty());
        assert_eq!(f.len(), 0);
        assert_eq!(f.as_slice(), b"");
        assert_eq!(f.bytes(0..0).len(), 0);
        f.advise_random();
        assert!(format!("{f:?}").contains("len: 0"));
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.bin");
        let e = MappedFile::open(&missing).unwrap_err();
        assert!(matches!(e, Error::Io { .. }));
        assert!(e.to_string().contains("missing.bin"), "{e}");

        let e = MappedFile::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = LocalFile::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
    }

    #[test]
    fn local_file_reads_at_offsets() {
        let (_dir, path) = file_with(b"0123456789");
        let f = LocalFile::open(&path).unwrap();
        assert_eq!(f.len(), 10);
        assert!(!f.is_empty());
        assert_eq!(f.path(), path);
        let mut buf = [0u8; 4];
        f.read_exact_at(3, &mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        assert_eq!(f.read_at(8, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"89");
        assert_eq!(f.read_at(10, &mut buf).unwrap(), 0);

        let e = f.read_exact_at(8, &mut buf).unwrap_err();
        let Error::Io { path: p, source } = &e else {
            panic!("expected an io error, got {e}")
        };
        assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof);
        assert!(p.ends_with("f.bin"));
        let msg = e.to_string();
        assert!(
            msg.contains("at byte 8") && msg.contains("ends at byte 10"),
            "{msg}"
        );
    }
}
