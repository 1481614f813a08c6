//! Tar archives without I/O: [`TarDecoder`] turns bytes into [`Member`]s (path, size and the
//! byte range of the data), [`TarSlice`] runs it over an archive already in memory (a memory
//! map), and [`TarWriter`] writes deterministic POSIX archives.
//!
//! # What the decoder reads
//!
//! - ustar (POSIX `ustar\0` `00`: `prefix` + `/` + `name`), GNU (`ustar  \0`) and old V7
//!   headers; the checksum is verified, as the unsigned or the signed byte sum (both exist in
//!   the wild; Python's `tarfile` accepts both);
//! - GNU long names and long link names (typeflags `L` and `K`);
//! - pax extended headers: `x` (the next member) and `g` (global). From `x` it honours `path`
//!   and `size` (the size overrides the header's octal or base-256 field);
//! - numeric fields in octal or base-256 (GNU's encoding for sizes of 8 GiB and more);
//! - regular files (`0`, `\0`, and `7`, contiguous files, which every reader treats as regular)
//!   are yielded as members; directories, links, devices, FIFOs and unknown types are skipped,
//!   never followed: the decoder touches no file system at all;
//! - the end of the archive is the first all-zero block (POSIX writes two, some writers one).
//!
//! # Rules that keep readers from disagreeing
//!
//! Tar has many dialects, and a reader that parses an archive differently from the tool that
//! checks it can be made to see other files (see tar-rs' advisories RUSTSEC-2026-0067 and
//! GHSA-3pv8-6f4r-ffg2 in `CRATES.md`). This decoder applies the rules tar-rs 0.4.46 settled
//! on and refuses, as [`Error::Corrupt`], every archive on which tar-rs, GNU tar and Python's
//! `tarfile` (what `webdataset` reads with) would disagree about framing or names:
//!
//! - a pax `x` header and a GNU long name apply to the next *real* member, never to another
//!   extension header between them (`x`, then `L`, then the file: both apply to the file, and
//!   the `L` header's own size comes from its own header);
//! - a pax `size` is honoured for every member, skipped ones included;
//! - two `x` (or two `L`, two `K`) headers for one member, an extension header with nothing
//!   after it, or a `g` header between an extension header and its member are errors;
//! - a `g` header that sets `path` or `size` is an error (tar-rs ignores global headers, GNU
//!   tar applies them); other global keywords (a `comment`, as `git archive` writes) are fine;
//! - a GNU long name and a pax path that differ, a pax path of a regular file ending in `/`
//!   (Python strips it, tar-rs keeps it), a long name with bytes after a NUL, malformed or
//!   duplicated pax records, and pax `size` values that are not plain decimal are errors;
//! - links, directories, devices and FIFOs must have size 0 (POSIX says they carry no data,
//!   tar-rs skips their size, GNU tar skips it except for directories);
//! - sparse files (`S`, pax `GNU.sparse.*`) and Solaris `X` headers are refused: their data is
//!   not the file's bytes and readers lay them out differently;
//! - after the end-of-archive block only zero bytes may follow: readers stop at the marker,
//!   so anything after it (two archives concatenated) would be silently invisible.
//!
//! A shard that ends without the end-of-archive block, or in the middle of a header or of a
//! member's data, is an error whose reason starts with `truncated:` and names the offset: an
//! interrupted download never looks like a complete shard.
//!
//! # Cost
//!
//! One pass, no allocation per member: a header is one 512-byte checksum, the path is copied
//! into a buffer the decoder reuses, and a member's data is skipped by arithmetic (the caller
//! slices it out of its own buffer). Hostile sizes cost nothing: nothing is allocated from a
//! size read from the data except extension headers, which are capped by
//! [`TarOptions::max_header_size`]; [`TarOptions::max_member_size`] caps members.
//!
//! ```
//! use chute_formats::tar::{TarOptions, TarSlice, TarWriter};
//!
//! let mut w = TarWriter::new(Vec::new());
//! w.append("cat.jpg", b"jpeg bytes")?;
//! w.append("cat.cls", b"3")?;
//! let archive = w.finish()?;
//!
//! let mut tar = TarSlice::new(&archive, "mem://cats.tar", TarOptions::default());
//! let mut names = Vec::new();
//! while let Some((member, data)) = tar.next_member()? {
//!     names.push((String::from_utf8(member.path.to_vec())?, data.to_vec()));
//! }
//! assert_eq!(names, [("cat.jpg".into(), b"jpeg bytes".to_vec()), ("cat.cls".into(), b"3".to_vec())]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, Write};
use std::ops::Range;

use chute_core::{Corruption, Error};

/// Size of a tar block: headers are one block, data is padded to whole blocks.
pub const BLOCK_SIZE: usize = 512;

const BLOCK: u64 = BLOCK_SIZE as u64;

/// Limits that keep hostile archives cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TarOptions {
    /// The largest member (regular or skipped) accepted, in bytes. Default: the process's
    /// [`Limits::max_record_bytes`](chute_core::Limits) (1 GiB unless raised). It guards the
    /// readers that would otherwise buffer, wait for or skip a size read from a damaged
    /// header.
    pub max_member_size: u64,
    /// The largest pax extended header or GNU long name accepted, in bytes: these are the only
    /// bytes the decoder buffers. Default 1 MiB.
    pub max_header_size: u64,
}

impl Default for TarOptions {
    fn default() -> Self {
        TarOptions {
            max_member_size: chute_core::Limits::current().max_record_bytes,
            max_header_size: 1 << 20,
        }
    }
}

/// A regular file in the archive: where its headers and data are. Offsets are absolute byte
/// offsets in the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// The path as stored (pax `path`, GNU long name, or ustar `prefix/name`), not normalised:
    /// `./a.jpg` stays `./a.jpg`. Raw bytes: tar does not promise UTF-8.
    pub path: &'a [u8],
    /// Offset of the member's first header block, its pax `x` and GNU `L`/`K` headers
    /// included: a decoder started here reads this member exactly.
    pub header_offset: u64,
    /// Offset of the first data byte.
    pub data_offset: u64,
    /// Data size in bytes (the pax `size` when there is one).
    pub size: u64,
}

impl Member<'_> {
    /// The data's byte range in the archive.
    pub fn data_range(&self) -> Range<u64> {
        self.data_offset..self.data_offset + self.size
    }

    /// Offset just after the member's data padding: where the next header starts.
    pub fn end_offset(&self) -> u64 {
        self.data_offset + padded(self.size)
    }
}

/// What [`TarDecoder::decode`] found: where the member is, without borrowing the decoder.
#[derive(Debug, Clone, Copy)]
struct Found {
    header_offset: u64,
    data_offset: u64,
    size: u64,
}

/// Which extension header's data is being collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ext {
    /// `L`: the next member's path.
    LongName,
    /// `K`: the next member's link target (read and dropped: links are skipped).
    LongLink,
    /// `x`: pax records for the next member.
    Pax,
    /// `g`: pax records for the rest of the archive.
    Global,
}

impl Ext {
    fn what(self) -> &'static str {
        match self {
            Ext::LongName => "GNU long-name header",
            Ext::LongLink => "GNU long-link header",
            Ext::Pax => "pax extended header",
            Ext::Global => "pax global header",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a header block; `fill` bytes of it are in `block`.
    Header,
    /// Collecting `remaining` bytes of an extension header's data, then `padding`.
    Ext {
        ext: Ext,
        header_offset: u64,
        remaining: u64,
        padding: u64,
    },
    /// Skipping a member's data and padding.
    Skip { remaining: u64 },
    /// Past the end-of-archive block at `at`: only zeros may follow.
    End { at: u64 },
    /// An error was returned; the decoder cannot go on.
    Failed,
}

/// What extension headers have said about the next real member.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    /// Offset of the first extension header of the next member.
    start: Option<u64>,
    long_name: bool,
    long_link: bool,
    pax: bool,
    pax_path: bool,
    pax_size: Option<u64>,
}

/// The member whose data is being skipped, for truncation messages.
#[derive(Debug, Clone, Copy)]
struct Current {
    header_offset: u64,
    data_offset: u64,
    size: u64,
}

/// A sans-IO streaming tar decoder: feed it the archive's bytes in order, in pieces of any
/// size, and it yields each regular file as a [`Member`].
///
/// The decoder never copies member data and never does I/O: it reports where a member's data
/// is (absolute offsets), and a caller that wants the bytes slices them out of what it fed
/// (a memory map: see [`TarSlice`]) or keeps them as they stream past.
///
/// ```
/// use chute_formats::tar::{TarDecoder, TarOptions, TarWriter};
///
/// let mut w = TarWriter::new(Vec::new());
/// w.append("a.txt", b"hello")?;
/// let archive = w.finish()?;
///
/// // Feed it 100 bytes at a time, as a network stream would.
/// let mut decoder = TarDecoder::new("mem://a.tar", TarOptions::default());
/// let mut found = Vec::new();
/// for chunk in archive.chunks(100) {
///     let mut rest = chunk;
///     while !rest.is_empty() {
///         let (used, member) = decoder.decode(rest)?;
///         if let Some(m) = member {
///             found.push((m.path.to_vec(), m.data_range()));
///         }
///         rest = &rest[used..];
///     }
/// }
/// decoder.finish()?; // errors if the stream stopped early
/// assert_eq!(found, [(b"a.txt".to_vec(), 512..517)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TarDecoder {
    uri: String,
    options: TarOptions,
    /// Absolute offset of the next byte `decode` expects.
    offset: u64,
    state: State,
    /// A header block split across `decode` calls.
    block: [u8; BLOCK_SIZE],
    fill: usize,
    pending: Pending,
    current: Option<Current>,
    /// The data of the extension header being collected.
    ext: Vec<u8>,
    long_name: Vec<u8>,
    pax_path: Vec<u8>,
    /// The path of the last member found.
    path: Vec<u8>,
}

impl TarDecoder {
    /// A decoder for the archive `uri` (used in error messages only), starting at byte 0.
    pub fn new(uri: impl Into<String>, options: TarOptions) -> Self {
        TarDecoder {
            uri: uri.into(),
            options,
            offset: 0,
            state: State::Header,
            block: [0; BLOCK_SIZE],
            fill: 0,
            pending: Pending::default(),
            current: None,
            ext: Vec::new(),
            long_name: Vec::new(),
            pax_path: Vec::new(),
            path: Vec::new(),
        }
    }

    /// Starts decoding at `offset` instead of 0: for a range of the archive that begins at a
    /// member's [`Member::header_offset`] (an index entry), so offsets in members and errors
    /// are the archive's. Pair with [`TarDecoder::finish_fragment`].
    pub fn starting_at(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// The archive's name, as given.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Absolute offset of the next byte [`TarDecoder::decode`] expects.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the end-of-archive block has been read.
    pub fn is_end(&self) -> bool {
        matches!(self.state, State::End { .. })
    }

    /// Decodes from `input`, the archive's bytes starting at [`TarDecoder::offset`].
    ///
    /// Returns how many bytes of `input` were used and, when a regular file's header was
    /// complete, that member. The member's data follows in the stream; the decoder skips it
    /// as it is fed (so `used` may stop right after a header: call again with the rest). When
    /// no member is returned, all of `input` was used. After the end-of-archive block, input
    /// must be zeros.
    ///
    /// Fails with [`Error::Corrupt`] naming the archive, the offset of the bad header and what
    /// was wrong; the decoder is then done and every later call fails.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Member<'_>>), Error> {
        match self.decode_raw(input) {
            Ok((used, Some(f))) => Ok((
                used,
                Some(Member {
                    path: &self.path,
                    header_offset: f.header_offset,
                    data_offset: f.data_offset,
                    size: f.size,
                }),
            )),
            Ok((used, None)) => Ok((used, None)),
            Err(e) => {
                self.state = State::Failed;
                Err(e)
            }
        }
    }

    fn decode_raw(&mut self, input: &[u8]) -> Result<(usize, Option<Found>), Error> {
        let mut pos = 0;
        loop {
            let avail = input.len() - pos;
            match self.state {
                State::Failed => {
                    return Err(self.corrupt(
                        self.offset,
                        "the decoder already failed here; start a new one".into(),
                    ));
                }
                State::Skip { remaining } => {
                    let n = remaining.min(avail as u64);
                    pos += n as usize;
                    self.offset += n;
                    if n < remaining {
                        self.state = State::Skip {
                            remaining: remaining - n,
                        };
                        return Ok((pos, None));
                    }
                    self.state = State::Header;
                    self.current = None;
                }
                State::Ext {
                    ext,
                    header_offset,
                    remaining,
                    padding,
                } => {
                    let n = remaining.min(avail as u64) as usize;
                    self.ext.extend_from_slice(&input[pos..pos + n]);
                    pos += n;
                    self.offset += n as u64;
                    if (n as u64) < remaining {
                        self.state = State::Ext {
                            ext,
                            header_offset,
                            remaining: remaining - n as u64,
                            padding,
                        };
                        return Ok((pos, None));
                    }
                    self.finish_ext(ext, header_offset)?;
                    self.state = if padding == 0 {
                        State::Header
                    } else {
                        State::Skip { remaining: padding }
                    };
                }
                State::End { at } => {
                    if let Some(i) = input[pos..].iter().position(|&b| b != 0) {
                        let bad = self.offset + i as u64;
                        return Err(self.corrupt(
                            bad,
                            format!(
                                "data after the end-of-archive block at byte {at}: tar readers \
                                 stop at that block, so whatever follows (a second archive \
                                 appended?) would be silently lost; re-create the shard as one \
                                 archive"
                            ),
                        ));
                    }
                    self.offset += avail as u64;
                    return Ok((input.len(), None));
                }
                State::Header => {
                    let header_offset = self.offset - self.fill as u64;
                    let found = if self.fill == 0 && avail >= BLOCK_SIZE {
                        let block: &[u8; BLOCK_SIZE] = input[pos..pos + BLOCK_SIZE]
                            .try_into()
                            .expect("a block-sized slice");
                        pos += BLOCK_SIZE;
                        self.offset += BLOCK;
                        self.header(block, header_offset)?
                    } else {
                        let n = (BLOCK_SIZE - self.fill).min(avail);
                        self.block[self.fill..self.fill + n].copy_from_slice(&input[pos..pos + n]);
                        self.fill += n;
                        pos += n;
                        self.offset += n as u64;
                        if self.fill < BLOCK_SIZE {
                            return Ok((pos, None));
                        }
                        self.fill = 0;
                        let block = self.block;
                        self.header(&block, header_offset)?
                    };
                    if let Some(found) = found {
                        return Ok((pos, Some(found)));
                    }
                }
            }
        }
    }

    /// Handles one header block read at `at`; returns the member when it is a regular file.
    fn header(&mut self, b: &[u8; BLOCK_SIZE], at: u64) -> Result<Option<Found>, Error> {
        let total: u32 = b.iter().map(|&x| u32::from(x)).sum();
        if total == 0 {
            if let Some(start) = self.pending.start {
                return Err(self.corrupt(
                    start,
                    format!(
                        "the extension header at byte {start} describes a member, but the \
                         archive ends (zero block at byte {at}) before any member follows"
                    ),
                ));
            }
            self.state = State::End { at };
            return Ok(None);
        }
        self.check_sum(b, total, at)?;

        let typeflag = b[156];
        let posix = &b[257..263] == b"ustar\0";
        let posix_00 = posix && &b[263..265] == b"00";
        let gnu = &b[257..265] == b"ustar  \0";
        let header_size = parse_numeric(&b[124..136]).map_err(|why| {
            self.corrupt(
                at,
                format!(
                    "the header's size field {:?} is {why}; the header is damaged",
                    String::from_utf8_lossy(&b[124..136])
                ),
            )
        })?;

        let ext = match typeflag {
            b'L' => Some(Ext::LongName),
            b'K' => Some(Ext::LongLink),
            b'x' => Some(Ext::Pax),
            b'g' => Some(Ext::Global),
            _ => None,
        };
        if let Some(ext) = ext {
            return self
                .start_ext(ext, posix_00 || gnu, header_size, at)
                .map(|()| None);
        }
        match typeflag {
            b'S' => {
                return Err(self.corrupt_as(
                    Corruption::Unsupported,
                    at,
                    "a GNU sparse member: its stored bytes are not the file's, and readers lay \
                     them out differently; re-create the shard without --sparse"
                        .into(),
                ));
            }
            b'X' => {
                return Err(self.corrupt_as(
                    Corruption::Unsupported,
                    at,
                    "a Solaris extended header ('X'): readers disagree on whether it applies to \
                     the next member; re-create the shard with pax ('x') headers"
                        .into(),
                ));
            }
            _ => {}
        }

        // A real member: apply what the extension headers before it said.
        let pending = std::mem::take(&mut self.pending);
        let header_offset = pending.start.unwrap_or(at);
        let size = pending.pax_size.unwrap_or(header_size);
        let name = cstr(&b[0..100]);
        self.path.clear();
        if pending.long_name && pending.pax_path && self.long_name != self.pax_path {
            return Err(self.corrupt(
                header_offset,
                format!(
                    "the member has both a GNU long name {:?} and a pax path {:?}, and they \
                     differ: readers disagree on which wins; re-create the shard",
                    String::from_utf8_lossy(&self.long_name),
                    String::from_utf8_lossy(&self.pax_path)
                ),
            ));
        }
        if pending.pax_path {
            self.path.extend_from_slice(&self.pax_path);
        } else if pending.long_name {
            self.path.extend_from_slice(&self.long_name);
        } else {
            let prefix = cstr(&b[345..500]);
            if posix && !prefix.is_empty() {
                if !posix_00 {
                    return Err(self.corrupt(
                        at,
                        format!(
                            "a ustar header with version {:?} instead of \"00\" and a name \
                             prefix: readers disagree on whether the prefix is part of the \
                             name; re-create the shard",
                            String::from_utf8_lossy(&b[263..265])
                        ),
                    ));
                }
                self.path.extend_from_slice(prefix);
                self.path.push(b'/');
            }
            self.path.extend_from_slice(name);
        }

        let regular = match typeflag {
            b'0' | b'7' => true,
            // Old (V7) archives mark directories with a trailing slash; Python's tarfile reads
            // them as directories too.
            0 => !name.ends_with(b"/"),
            _ => false,
        };
        if typeflag == 0 && !regular && size != 0 {
            return Err(self.corrupt(
                at,
                format!(
                    "member {:?} has typeflag NUL and a name field ending in '/' ({:?}):                      Python's tarfile (so webdataset) reads it as a directory and skips no data,                      other readers read a {size}-byte file; re-create the shard with typeflag                      '0' for regular files",
                    String::from_utf8_lossy(&self.path),
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        if matches!(typeflag, b'1'..=b'6') && size != 0 {
            return Err(self.corrupt(
                at,
                format!(
                    "{} {:?} declares {size} data bytes: POSIX says such members carry no \
                     data, and readers disagree on whether to skip them; re-create the shard",
                    kind_name(typeflag),
                    String::from_utf8_lossy(&self.path)
                ),
            ));
        }
        if regular && pending.pax_path && self.path.ends_with(b"/") {
            return Err(self.corrupt(
                header_offset,
                format!(
                    "the regular file's pax path {:?} ends with '/': Python's tarfile strips \
                     it, other readers keep it; re-create the shard",
                    String::from_utf8_lossy(&self.path)
                ),
            ));
        }
        if size > self.options.max_member_size {
            return Err(self.corrupt_as(
                Corruption::TooLarge,
                at,
                chute_core::limits::exceeded(
                    &format!("member {:?}", String::from_utf8_lossy(&self.path)),
                    size,
                    "bytes",
                    "max_record_bytes",
                    self.options.max_member_size,
                ),
            ));
        }
        let data_offset = at + BLOCK;
        let skip = size
            .checked_add(BLOCK - 1)
            .map(|s| s & !(BLOCK - 1))
            .filter(|s| data_offset.checked_add(*s).is_some())
            .ok_or_else(|| {
                self.corrupt_as(
                    Corruption::TooLarge,
                    at,
                    format!("member size {size} runs past any possible archive"),
                )
            })?;
        self.state = if skip == 0 {
            State::Header
        } else {
            State::Skip { remaining: skip }
        };
        self.current = Some(Current {
            header_offset,
            data_offset,
            size,
        });
        Ok(regular.then_some(Found {
            header_offset,
            data_offset,
            size,
        }))
    }

    fn check_sum(&self, b: &[u8; BLOCK_SIZE], total: u32, at: u64) -> Result<(), Error> {
        let (ok, stored, unsigned) = checksum(b, total);
        if ok {
            return Ok(());
        }
        let hint = if at == 0 {
            "; is this a tar file? (compressed shards must be decompressed first)"
        } else {
            "; the shard is damaged (a flipped byte, or an index that points into the middle \
             of a member)"
        };
        let stored = match stored {
            Some(s) => s.to_string(),
            None => format!("{:?}", String::from_utf8_lossy(&b[148..156])),
        };
        Err(self.corrupt_as(
            Corruption::Checksum,
            at,
            format!(
                "header checksum mismatch: the header says {stored}, its bytes sum to \
                 {unsigned}{hint}"
            ),
        ))
    }

    fn start_ext(&mut self, ext: Ext, known_magic: bool, size: u64, at: u64) -> Result<(), Error> {
        if !known_magic {
            return Err(self.corrupt(
                at,
                format!(
                    "a {} in a header without ustar or GNU magic: readers disagree on whether \
                     it applies; re-create the shard",
                    ext.what()
                ),
            ));
        }
        let p = &self.pending;
        let twice = match ext {
            Ext::LongName => p.long_name,
            Ext::LongLink => p.long_link,
            Ext::Pax => p.pax,
            Ext::Global => p.start.is_some(),
        };
        if twice {
            let why = if ext == Ext::Global {
                format!(
                    "a pax global header between the extension header at byte {} and the \
                     member it describes: readers disagree on which member gets what",
                    p.start.unwrap_or(at)
                )
            } else {
                format!(
                    "a second {} for one member (the first is at or after byte {}): readers \
                     disagree on which one wins",
                    ext.what(),
                    p.start.unwrap_or(at)
                )
            };
            return Err(self.corrupt(at, format!("{why}; re-create the shard")));
        }
        if size > self.options.max_header_size {
            return Err(self.corrupt_as(
                Corruption::TooLarge,
                at,
                format!(
                    "a {} of {size} bytes, more than the limit of {} \
                     (TarOptions::max_header_size); the header is damaged, or raise the limit",
                    ext.what(),
                    self.options.max_header_size
                ),
            ));
        }
        if ext != Ext::Global {
            self.pending.start.get_or_insert(at);
        }
        self.ext.clear();
        self.state = State::Ext {
            ext,
            header_offset: at,
            remaining: size,
            padding: padded(size) - size,
        };
        Ok(())
    }

    fn finish_ext(&mut self, ext: Ext, at: u64) -> Result<(), Error> {
        match ext {
            Ext::LongName => {
                // Writers store the name and one NUL. GNU tar and Python stop at the first
                // NUL, tar-rs drops one trailing NUL and keeps the rest: anything else is
                // read differently.
                let n = self
                    .ext
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(self.ext.len());
                if self.ext.len() > n + 1 {
                    return Err(self.corrupt(
                        at,
                        "the GNU long name has bytes after its terminating NUL: readers \
                         disagree on where it ends; re-create the shard"
                            .into(),
                    ));
                }
                self.ext.truncate(n);
                std::mem::swap(&mut self.ext, &mut self.long_name);
                self.pending.long_name = true;
            }
            Ext::LongLink => self.pending.long_link = true,
            Ext::Pax | Ext::Global => {
                let records = std::mem::take(&mut self.ext);
                let result = self.pax(&records, ext, at);
                self.ext = records;
                result?;
            }
        }
        Ok(())
    }

    /// Parses pax records `"<len> <key>=<value>\n"`; keeps `path` and `size` of an `x` header.
    fn pax(&mut self, mut data: &[u8], ext: Ext, at: u64) -> Result<(), Error> {
        let global = ext == Ext::Global;
        if !global {
            self.pending.pax = true;
        }
        let mut pos = 0usize;
        while !data.is_empty() {
            let bad = |why: &str| {
                self.corrupt(
                    at,
                    format!(
                        "malformed {} (record at data byte {pos}): {why}; the header is damaged",
                        ext.what()
                    ),
                )
            };
            let digits = data.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == 0 || data.get(digits) != Some(&b' ') {
                return Err(bad(
                    "a record must start with its decimal length and a space",
                ));
            }
            let len: usize = std::str::from_utf8(&data[..digits])
                .ok()
                .and_then(|s| s.parse().ok())
                .filter(|&n| n > digits + 1 && n <= data.len())
                .ok_or_else(|| bad("the record length runs past the header's data"))?;
            let record = &data[digits + 1..len];
            let Some((b'\n', body)) = record.split_last() else {
                return Err(bad("the record does not end with a newline"));
            };
            let Some(eq) = body.iter().position(|&b| b == b'=') else {
                return Err(bad("the record has no '='"));
            };
            let (key, value) = (&body[..eq], &body[eq + 1..]);
            if key.is_empty() {
                return Err(bad("the record has an empty keyword"));
            }
            // tar-rs splits records at newlines, Python and GNU tar trust the length: a
            // newline inside a record would frame the header differently for each.
            if body.contains(&b'\n') {
                return Err(bad("a newline inside a record"));
            }
            if key.starts_with(b"GNU.sparse.") {
                return Err(self.corrupt_as(
                    Corruption::Unsupported,
                    at,
                    "pax GNU.sparse records: sparse members are not supported (their stored \
                     bytes are not the file's); re-create the shard without --sparse"
                        .into(),
                ));
            }
            match key {
                b"path" | b"size" if global => {
                    return Err(self.corrupt(
                        at,
                        format!(
                            "a pax global header sets {:?}: tar-rs ignores global headers and \
                             GNU tar applies them to every member, so readers would disagree; \
                             re-create the shard",
                            String::from_utf8_lossy(key)
                        ),
                    ));
                }
                b"path" => {
                    if self.pending.pax_path {
                        return Err(bad("two path records"));
                    }
                    if value.is_empty() {
                        return Err(bad("an empty path"));
                    }
                    self.pax_path.clear();
                    self.pax_path.extend_from_slice(value);
                    self.pending.pax_path = true;
                }
                b"size" => {
                    if self.pending.pax_size.is_some() {
                        return Err(bad("two size records"));
                    }
                    let size = std::str::from_utf8(value)
                        .ok()
                        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or_else(|| {
                            bad(&format!(
                                "size {:?} is not a decimal number of bytes",
                                String::from_utf8_lossy(value)
                            ))
                        })?;
                    self.pending.pax_size = Some(size);
                }
                _ => {}
            }
            data = &data[len..];
            pos += len;
        }
        Ok(())
    }

    /// Checks that the archive ended properly: after the end-of-archive block. Call it when
    /// the input is exhausted.
    ///
    /// Fails with [`Error::Corrupt`] whose reason starts with `truncated:` and names the
    /// offset where the bytes stopped if the archive ended early (no end-of-archive block, in
    /// a header or in a member's data), so a cut-short download never looks complete.
    pub fn finish(&self) -> Result<(), Error> {
        if let State::End { .. } = self.state {
            return Ok(());
        }
        self.truncated("before the end-of-archive block (a zero block)")
    }

    /// Checks that the input stopped cleanly between two members, for a decoder run over a
    /// range of the archive (see [`TarDecoder::starting_at`]) rather than the whole of it.
    /// The end-of-archive block may or may not have been read.
    pub fn finish_fragment(&self) -> Result<(), Error> {
        match self.state {
            State::End { .. } => Ok(()),
            State::Header if self.fill == 0 && self.pending.start.is_none() => Ok(()),
            _ => self.truncated("at the end of the range"),
        }
    }

    fn truncated(&self, otherwise: &str) -> Result<(), Error> {
        let end = self.offset;
        let reason = match self.state {
            State::Failed => "the decoder already failed".to_string(),
            State::End { .. } => unreachable!("an ended archive is complete"),
            State::Header if self.fill > 0 => format!(
                "the data stops at byte {end}, inside the header block that starts \
                 at byte {}",
                end - self.fill as u64
            ),
            State::Header if self.pending.start.is_some() => format!(
                "the data stops at byte {end}, after the extension header at byte {} \
                 and before the member it describes",
                self.pending.start.unwrap_or_default()
            ),
            State::Header if end == 0 => {
                "the shard is empty (0 bytes); even an empty tar archive holds an \
                 end-of-archive block"
                    .to_string()
            }
            State::Header => format!("the data stops at byte {end}, {otherwise}"),
            State::Ext {
                ext, header_offset, ..
            } => format!(
                "the data stops at byte {end}, inside the {} at byte {header_offset}",
                ext.what()
            ),
            State::Skip { remaining } => match self.current {
                Some(c) if end < c.data_offset + c.size => format!(
                    "the data stops at byte {end}, inside member {:?} (header at \
                     byte {}, {} data bytes from byte {}; {} missing)",
                    String::from_utf8_lossy(&self.path),
                    c.header_offset,
                    c.size,
                    c.data_offset,
                    c.data_offset + c.size - end
                ),
                _ => format!(
                    "the data stops at byte {end}, inside the padding after a \
                     member ({remaining} bytes missing)"
                ),
            },
        };
        if self.state == State::Failed {
            return Err(self.corrupt(end, reason));
        }
        Err(self.corrupt_as(
            Corruption::Truncated,
            end,
            format!("{reason}; the shard is incomplete (an interrupted download or write?)"),
        ))
    }

    fn corrupt(&self, offset: u64, reason: String) -> Error {
        self.corrupt_as(Corruption::Malformed, offset, reason)
    }

    fn corrupt_as(&self, kind: Corruption, offset: u64, reason: String) -> Error {
        Error::corrupt_as(kind, self.uri.clone(), offset, reason)
    }
}

/// A whole archive (or a range of one) in memory, decoded member by member with
/// [`TarDecoder`]: data comes back as slices of the input, never copied.
#[derive(Debug)]
pub struct TarSlice<'a> {
    data: &'a [u8],
    /// Absolute offset of `data[0]`.
    base: u64,
    pos: usize,
    decoder: TarDecoder,
    fragment: bool,
    done: bool,
}

impl<'a> TarSlice<'a> {
    /// Decodes `data`, a whole archive; `uri` names it in errors.
    pub fn new(data: &'a [u8], uri: impl Into<String>, options: TarOptions) -> Self {
        TarSlice {
            data,
            base: 0,
            pos: 0,
            decoder: TarDecoder::new(uri, options),
            fragment: false,
            done: false,
        }
    }

    /// Decodes `data`, the archive's bytes from `offset` on, which must start at a member's
    /// first header and end between two members (an index entry's range). Offsets in members
    /// and errors are the archive's.
    pub fn fragment(
        data: &'a [u8],
        offset: u64,
        uri: impl Into<String>,
        options: TarOptions,
    ) -> Self {
        TarSlice {
            data,
            base: offset,
            pos: 0,
            decoder: TarDecoder::new(uri, options).starting_at(offset),
            fragment: true,
            done: false,
        }
    }

    /// The next regular file and its data (a slice of the input), or `None` after the last
    /// one. The end of the input is checked as [`TarDecoder::finish`] (or
    /// [`TarDecoder::finish_fragment`]) does, so a cut-short archive is an error, not a short
    /// list. After `None` or an error, returns `None`.
    #[allow(clippy::type_complexity)]
    pub fn next_member(&mut self) -> Result<Option<(Member<'_>, &'a [u8])>, Error> {
        if self.done {
            return Ok(None);
        }
        loop {
            let (used, found) = match self.decoder.decode_raw(&self.data[self.pos..]) {
                Ok(r) => r,
                Err(e) => {
                    self.decoder.state = State::Failed;
                    self.done = true;
                    return Err(e);
                }
            };
            self.pos += used;
            if let Some(f) = found {
                let start = (f.data_offset - self.base) as usize;
                // The data may run past the input (a truncated archive): hand out what is
                // there only once the decoder has seen all of it.
                let end = (start as u64)
                    .saturating_add(f.size)
                    .min(self.data.len() as u64) as usize;
                if (end - start) as u64 != f.size {
                    self.pos = self.data.len();
                    let _ = self.decoder.decode_raw(&self.data[start..]);
                    self.done = true;
                    return Err(self.finish_error());
                }
                let data = &self.data[start..end];
                return Ok(Some((
                    Member {
                        path: &self.decoder.path,
                        header_offset: f.header_offset,
                        data_offset: f.data_offset,
                        size: f.size,
                    },
                    data,
                )));
            }
            if self.pos == self.data.len() {
                self.done = true;
                let r = if self.fragment {
                    self.decoder.finish_fragment()
                } else {
                    self.decoder.finish()
                };
                return r.map(|()| None);
            }
        }
    }

    fn finish_error(&self) -> Error {
        let r = if self.fragment {
            self.decoder.finish_fragment()
        } else {
            self.decoder.finish()
        };
        r.expect_err("a member that runs past the input is a truncation")
    }

    /// The decoder, for its offset and state.
    pub fn decoder(&self) -> &TarDecoder {
        &self.decoder
    }
}

/// Writes POSIX (pax-extended ustar) archives, deterministically, to any [`Write`].
///
/// Every member is a regular file with mode `0644`, uid and gid 0, empty user and group
/// names, mtime 0 (1970-01-01) and magic `ustar\0` version `00`: the same input always gives
/// the same bytes, which keeps shards reproducible and comparable by hash. A path that is
/// longer than 100 bytes or not ASCII, and a size of 8 GiB or more, go in a pax `x` header
/// (named `././@PaxHeader`, as Python's `tarfile` names it) before the member, the ustar
/// fields then holding a truncated name and size 0, as Python's `tarfile` writes them. GNU
/// tar, bsdtar, Python's `tarfile` (so `webdataset`) and tar-rs all read these archives.
/// [`TarWriter::finish`] writes the end-of-archive marker: two zero blocks (no padding to
/// tape records).
#[derive(Debug)]
pub struct TarWriter<W: Write> {
    out: W,
    offset: u64,
}

/// Bytes of the end-of-archive marker [`TarWriter::finish`] writes.
pub const END_OF_ARCHIVE_LEN: u64 = 2 * BLOCK;

/// The largest size the ustar size field holds (11 octal digits); larger sizes go in pax.
const USTAR_MAX_SIZE: u64 = (1 << 33) - 1;

static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

impl<W: Write> TarWriter<W> {
    /// A writer that appends members to `out`.
    pub fn new(out: W) -> Self {
        TarWriter { out, offset: 0 }
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.offset
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Appends a regular file `path` holding `data`; returns the byte range the member takes
    /// (its pax header, if any, its header, data and padding).
    ///
    /// Fails with [`io::ErrorKind::InvalidInput`] (writing nothing) if `path` is empty or holds
    /// a NUL byte, or with the writer's error.
    pub fn append(&mut self, path: &str, data: &[u8]) -> io::Result<Range<u64>> {
        check_path(path)?;
        let start = self.offset;
        let size = data.len() as u64;
        let pax = pax_records(path, size);
        if !pax.is_empty() {
            let header = ustar_header(b"././@PaxHeader", pax.len() as u64, b'x');
            self.put(&header)?;
            self.put(&pax)?;
            self.pad(pax.len() as u64)?;
        }
        let name = ustar_name(path);
        let header = ustar_header(&name, if size > USTAR_MAX_SIZE { 0 } else { size }, b'0');
        self.put(&header)?;
        self.put(data)?;
        self.pad(size)?;
        Ok(start..self.offset)
    }

    /// Writes the end-of-archive marker, flushes, and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.put(&ZEROS)?;
        self.put(&ZEROS)?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self, size: u64) -> io::Result<()> {
        let n = (padded(size) - size) as usize;
        self.put(&ZEROS[..n])
    }
}

/// The bytes [`TarWriter::append`] writes for a member `path` of `size` bytes: to plan
/// shard sizes before writing.
pub fn member_len(path: &str, size: u64) -> u64 {
    let pax = pax_records(path, size).len() as u64;
    let pax = if pax == 0 { 0 } else { BLOCK + padded(pax) };
    pax + BLOCK + padded(size)
}

fn check_path(path: &str) -> io::Result<()> {
    if path.is_empty() || path.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("tar member path {path:?} is empty or holds a NUL byte"),
        ));
    }
    Ok(())
}

/// The pax records a member needs (empty when the ustar header holds everything).
fn pax_records(path: &str, size: u64) -> Vec<u8> {
    let mut out = Vec::new();
    if path.len() > 100 || !path.is_ascii() {
        pax_record(&mut out, "path", path);
    }
    if size > USTAR_MAX_SIZE {
        pax_record(&mut out, "size", &size.to_string());
    }
    out
}

/// Appends `"<len> <key>=<value>\n"`, where `<len>` counts the whole record, itself included.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &str) {
    let rest = key.len() + value.len() + 3; // space, '=', newline
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    out.extend_from_slice(format!("{len} {key}={value}\n").as_bytes());
}

/// The ustar name field: the path, or for paths in a pax header its first 100 bytes with
/// non-ASCII bytes as `?` (what Python's tarfile writes there).
fn ustar_name(path: &str) -> Vec<u8> {
    path.bytes()
        .take(100)
        .map(|b| if b.is_ascii() { b } else { b'?' })
        .collect()
}

fn ustar_header(name: &[u8], size: u64, typeflag: u8) -> [u8; BLOCK_SIZE] {
    let mut h = [0u8; BLOCK_SIZE];
    h[..name.len()].copy_from_slice(name);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[329..337].copy_from_slice(b"0000000\0");
    h[337..345].copy_from_slice(b"0000000\0");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Whether the stored checksum of header `b` (whose bytes sum to `total`) matches its
/// unsigned or signed byte sum; also the stored value and the unsigned sum, for messages.
fn checksum(b: &[u8; BLOCK_SIZE], total: u32) -> (bool, Option<u64>, u32) {
    let field = &b[148..156];
    // The checksum is computed with its own field read as eight spaces.
    let field_sum: u32 = field.iter().map(|&x| u32::from(x)).sum();
    let unsigned = total - field_sum + 8 * u32::from(b' ');
    let stored = parse_octal(field);
    if stored == Some(u64::from(unsigned)) {
        return (true, stored, unsigned);
    }
    let signed: i64 = b.iter().map(|&x| i64::from(x as i8)).sum::<i64>()
        - field.iter().map(|&x| i64::from(x as i8)).sum::<i64>()
        + 8 * i64::from(b' ');
    let ok = stored.is_some_and(|s| i64::try_from(s) == Ok(signed));
    (ok, stored, unsigned)
}

/// Whether `block` is a header with a valid checksum or an all-zero block: a cheap check
/// that an offset from an index file points at a member boundary.
pub(crate) fn is_header_or_end(block: &[u8]) -> bool {
    let Ok(b) = <&[u8; BLOCK_SIZE]>::try_from(block) else {
        return false;
    };
    let total: u32 = b.iter().map(|&x| u32::from(x)).sum();
    total == 0 || checksum(b, total).0
}

/// `size` rounded up to whole blocks.
fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK) * BLOCK
}

/// A header field up to its first NUL.
fn cstr(field: &[u8]) -> &[u8] {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..n]
}

/// An octal field: optional blanks, digits, then only NULs or blanks (GNU tar, Python and
/// tar-rs all stop at the first NUL).
fn parse_octal(field: &[u8]) -> Option<u64> {
    let s = cstr(field).trim_ascii();
    if s.is_empty() || !s.iter().all(|b| (b'0'..=b'7').contains(b)) {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(8)?.checked_add(u64::from(d - b'0'))
    })
}

/// A numeric field in octal or base-256 (first byte 0x80, then big-endian; GNU's encoding for
/// values that do not fit in octal). Negative base-256 values (0xff) are refused.
fn parse_numeric(field: &[u8]) -> Result<u64, &'static str> {
    match field[0] {
        0x80 => {
            let (high, low) = field[1..].split_at(field.len() - 1 - 8);
            if high.iter().any(|&b| b != 0) {
                return Err("a base-256 number larger than 2^64");
            }
            Ok(u64::from_be_bytes(low.try_into().expect("8 bytes")))
        }
        0xff => Err("a negative base-256 number"),
        b if b & 0x80 != 0 => Err("neither octal nor base-256"),
        _ => parse_octal(field).ok_or("not an octal number"),
    }
}

fn kind_name(typeflag: u8) -> &'static str {
    match typeflag {
        b'1' => "hard link",
        b'2' => "symbolic link",
        b'3' => "character device",
        b'4' => "block device",
        b'5' | 0 => "directory",
        b'6' => "FIFO",
        _ => "member",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URI: &str = "mem://test.tar";

    /// (path, data) of every regular file, through the slice reader.
    fn read(data: &[u8]) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let mut t = TarSlice::new(data, URI, TarOptions::default());
        let mut out = Vec::new();
        while let Some((m, d)) = t.next_member()? {
            assert_eq!(m.size, d.len() as u64);
            assert_eq!(&data[m.data_offset as usize..][..d.len()], d);
            out.push((String::from_utf8_lossy(m.path).into_owned(), d.to_vec()));
        }
        Ok(out)
    }

    /// The same through the streaming decoder fed `chunk` bytes at a time, data collected
    /// from the chunks as they pass.
    fn read_streaming(data: &[u8], chunk: usize) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let mut d = TarDecoder::new(URI, TarOptions::default());
        let mut out: Vec<(String, Range<u64>)> = Vec::new();
        let mut fed = 0u64;
        for piece in data.chunks(chunk.max(1)) {
            let mut rest = piece;
            while !rest.is_empty() {
                let (used, m) = d.decode(rest)?;
                if let Some(m) = m {
                    out.push((String::from_utf8_lossy(m.path).into_owned(), m.data_range()));
                }
                rest = &rest[used..];
            }
            fed += piece.len() as u64;
            assert_eq!(d.offset(), fed);
        }
        d.finish()?;
        Ok(out
            .into_iter()
            .map(|(p, r)| (p, data[r.start as usize..r.end as usize].to_vec()))
            .collect())
    }

    fn ours(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = TarWriter::new(Vec::new());
        for (p, d) in members {
            w.append(p, d).unwrap();
        }
        w.finish().unwrap()
    }

    fn owned(members: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
        members
            .iter()
            .map(|(p, d)| (p.to_string(), d.to_vec()))
            .collect()
    }

    /// Reads `data` with the tar crate: (path, data) of regular files.
    fn tar_rs(data: &[u8]) -> std::io::Result<Vec<(String, Vec<u8>)>> {
        use std::io::Read;
        let mut a = ::tar::Archive::new(data);
        let mut out = Vec::new();
        for e in a.entries()? {
            let mut e = e?;
            let t = e.header().entry_type();
            let name_is_dir = e
                .header()
                .as_old()
                .name
                .split(|&b| b == 0)
                .next()
                .is_some_and(|n| n.ends_with(b"/"));
            let v7_dir = e.header().as_old().linkflag[0] == 0 && name_is_dir;
            if (t.is_file() || t == ::tar::EntryType::Continuous) && !v7_dir {
                let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
                let mut d = Vec::new();
                e.read_to_end(&mut d)?;
                out.push((path, d));
            }
        }
        Ok(out)
    }

    /// The shard, the offset and the message after them, as the user reads it (`truncated: `
    /// included).
    fn reason(e: &Error) -> (&str, u64, String) {
        match e {
            Error::Corrupt { uri, offset, .. } => {
                let text = e.to_string();
                let why = text[text.find(": ").map_or(0, |i| i + 2)..].to_string();
                (uri, *offset, why)
            }
            other => panic!("expected a corrupt error, got {other}"),
        }
    }

    /// A raw ustar header with `name`, `size` and `typeflag`, checksum set.
    fn raw_header(name: &[u8], size: u64, typeflag: u8) -> [u8; 512] {
        let mut h = ustar_header(name, size.min(USTAR_MAX_SIZE), typeflag);
        fix_sum(&mut h);
        h
    }

    fn fix_sum(h: &mut [u8]) {
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h[..512].iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    }

    fn pax_data(records: &[(&str, &str)]) -> Vec<u8> {
        let mut v = Vec::new();
        for (k, val) in records {
            pax_record(&mut v, k, val);
        }
        v
    }

    /// Appends a member (header + data + padding) to `out`.
    fn push(out: &mut Vec<u8>, header: [u8; 512], data: &[u8]) {
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.resize(
            out.len() + (padded(data.len() as u64) as usize - data.len()),
            0,
        );
    }

    fn end(out: &mut Vec<u8>) {
        out.extend_from_slice(&[0; 1024]);
    }

    #[test]
    fn round_trip_through_our_writer_and_the_tar_crate() {
        let long = format!("{}/{}.jpg", "d".repeat(120), "k".repeat(40));
        let unicode = "données/éléphant.json";
        let hundred = "x".repeat(100);
        let members: Vec<(&str, &[u8])> = vec![
            ("a.jpg", b"\xff\xd8jpeg"),
            ("a.cls", b"7"),
            ("empty.txt", b""),
            ("block.bin", &[7u8; 512]),
            (&long, b"long name"),
            (unicode, b"{}"),
            (&hundred, b"exactly 100"),
        ];
        let bytes = ours(&members);
        assert_eq!(bytes.len() % 512, 0);
        assert_eq!(read(&bytes).unwrap(), owned(&members));
        assert_eq!(tar_rs(&bytes).unwrap(), owned(&members));
        for chunk in [1, 7, 511, 512, 513, 4096] {
            assert_eq!(read_streaming(&bytes, chunk).unwrap(), owned(&members));
        }
        // Deterministic, and member_len predicts the layout.
        assert_eq!(bytes, ours(&members));
        let planned: u64 = members
            .iter()
            .map(|(p, d)| member_len(p, d.len() as u64))
            .sum::<u64>()
            + END_OF_ARCHIVE_LEN;
        assert_eq!(planned, bytes.len() as u64);
        // Header offsets cover the pax header; each member can be decoded on its own.
        let mut t = TarSlice::new(&bytes, URI, TarOptions::default());
        let mut spans = Vec::new();
        while let Some((m, _)) = t.next_member().unwrap() {
            spans.push((m.header_offset, m.end_offset(), m.path.to_vec()));
        }
        assert_eq!(spans[0].0, 0);
        for w in spans.windows(2) {
            assert_eq!(w[0].1, w[1].0);
        }
        for (start, end, path) in spans {
            let mut f = TarSlice::fragment(
                &bytes[start as usize..end as usize],
                start,
                URI,
                TarOptions::default(),
            );
            let (m, _) = f.next_member().unwrap().unwrap();
            assert_eq!((m.header_offset, m.path), (start, &path[..]));
            assert!(f.next_member().unwrap().is_none());
        }
    }

    #[test]
    fn reads_what_the_tar_crate_writes_gnu_ustar_and_pax() {
        let mut b = ::tar::Builder::new(Vec::new());
        // GNU headers: a long path becomes an 'L' member.
        let gnu_long = format!("{}/sample.seg.png", "dir.with.dots/".repeat(12));
        let mut h = ::tar::Header::new_gnu();
        h.set_size(3);
        b.append_data(&mut h, &gnu_long, &b"png"[..]).unwrap();
        // A ustar header: a 150-byte path is split into prefix and name.
        let split = format!("{}/{}.txt", "p".repeat(90), "n".repeat(55));
        let mut h = ::tar::Header::new_ustar();
        h.set_size(4);
        b.append_data(&mut h, &split, &b"text"[..]).unwrap();
        // A directory and a symlink in between, skipped.
        let mut h = ::tar::Header::new_gnu();
        h.set_entry_type(::tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, "somedir/", std::io::empty()).unwrap();
        let mut h = ::tar::Header::new_gnu();
        h.set_entry_type(::tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "link.jpg", "a.jpg").unwrap();
        // A hand-made pax 'x' header with a path and a size that overrides the header's 0.
        let pax_path = format!("{}/paxed.json", "q".repeat(200));
        let records = pax_data(&[("mtime", "1.5"), ("path", &pax_path), ("size", "5")]);
        let mut h = ::tar::Header::new_ustar();
        h.set_entry_type(::tar::EntryType::XHeader);
        h.set_size(records.len() as u64);
        b.append_data(&mut h, "PaxHeaders/x", &records[..]).unwrap();
        let mut h = ::tar::Header::new_ustar();
        h.set_size(0);
        h.set_path("truncated").unwrap();
        h.set_cksum();
        let mut data = Vec::new();
        b.get_mut().extend_from_slice(h.as_bytes());
        data.extend_from_slice(b"{\"a\"}");
        b.get_mut().extend_from_slice(&data);
        b.get_mut().extend_from_slice(&[0; 512 - 5]);
        let bytes = b.into_inner().unwrap();

        let want = vec![
            (gnu_long.clone(), b"png".to_vec()),
            (split.clone(), b"text".to_vec()),
            (pax_path.clone(), b"{\"a\"}".to_vec()),
        ];
        assert_eq!(tar_rs(&bytes).unwrap(), want);
        assert_eq!(read(&bytes).unwrap(), want);
        assert_eq!(read_streaming(&bytes, 3).unwrap(), want);
    }

    #[test]
    fn base256_sizes_and_signed_checksums() {
        // tar-rs writes sizes of 8 GiB and more in base-256; feed only the header.
        let mut h = ::tar::Header::new_gnu();
        h.set_path("huge.bin").unwrap();
        h.set_size(10 << 30);
        h.set_cksum();
        assert_eq!(h.as_bytes()[124], 0x80);
        let large = TarOptions {
            max_member_size: 64 << 30,
            ..TarOptions::default()
        };
        let mut d = TarDecoder::new(URI, large);
        let (used, m) = d.decode(h.as_bytes()).unwrap();
        let m = m.unwrap();
        assert_eq!(
            (used, m.path, m.size, m.data_offset),
            (512, &b"huge.bin"[..], 10 << 30, 512)
        );
        let e = d.finish().unwrap_err();
        let (_, off, why) = reason(&e);
        assert_eq!(off, 512);
        assert!(
            why.starts_with("truncated:") && why.contains("huge.bin"),
            "{why}"
        );

        // A member over the limit is refused before anything is skipped.
        let mut d = TarDecoder::new(
            URI,
            TarOptions {
                max_member_size: 1 << 30,
                ..TarOptions::default()
            },
        );
        let e = d.decode(h.as_bytes()).unwrap_err();
        assert!(
            reason(&e).2.contains("max_record_bytes = 1073741824"),
            "{e}"
        );

        // Negative and oversized base-256 fields.
        let mut bad = *h.as_bytes();
        bad[124] = 0xff;
        fix_sum(&mut bad);
        assert!(reason(&read(&bad).unwrap_err()).2.contains("negative"));
        bad[124] = 0x80;
        bad[125] = 1;
        fix_sum(&mut bad);
        assert!(reason(&read(&bad).unwrap_err()).2.contains("2^64"));

        // Signed checksum: bytes >= 0x80 in the name, summed as i8.
        let mut h = raw_header("caf\u{e9}.txt".as_bytes(), 2, b'0');
        h[148..156].copy_from_slice(b"        ");
        let signed: i64 = h.iter().map(|&b| i64::from(b as i8)).sum();
        h[148..156].copy_from_slice(format!("{signed:06o}\0 ").as_bytes());
        let mut a = Vec::new();
        push(&mut a, h, b"ok");
        end(&mut a);
        assert_eq!(
            read(&a).unwrap(),
            [("café.txt".to_string(), b"ok".to_vec())]
        );
    }

    #[test]
    fn pax_header_before_long_name_applies_to_the_member_not_the_long_name() {
        // GHSA-3pv8-6f4r-ffg2: 'x' (size=600), then 'L', then the file. The pax size is the
        // file's; the 'L' header's own size frames the long name.
        let long = format!("{}.jpg", "n".repeat(150));
        let mut a = Vec::new();
        let pax = pax_data(&[("size", "600")]);
        push(
            &mut a,
            raw_header(b"././@PaxHeader", pax.len() as u64, b'x'),
            &pax,
        );
        let mut name = long.clone().into_bytes();
        name.push(0);
        let mut l = raw_header(b"././@LongLink", name.len() as u64, b'L');
        l[257..265].copy_from_slice(b"ustar  \0");
        fix_sum(&mut l);
        push(&mut a, l, &name);
        let data = [9u8; 600];
        push(&mut a, raw_header(b"short", 0, b'0'), &data);
        push(&mut a, raw_header(b"after.txt", 1, b'0'), b"z");
        end(&mut a);
        let want = vec![
            (long.clone(), data.to_vec()),
            ("after.txt".into(), b"z".to_vec()),
        ];
        assert_eq!(read(&a).unwrap(), want);
        assert_eq!(tar_rs(&a).unwrap(), want);
        // The member's header offset is the pax header's, so a fragment reads it whole.
        let mut t = TarSlice::new(&a, URI, TarOptions::default());
        assert_eq!(t.next_member().unwrap().unwrap().0.header_offset, 0);
    }

    #[test]
    fn pax_size_is_honoured_when_skipping() {
        // RUSTSEC-2026-0067: a pax size on a skipped member hides a fake header in its data.
        let fake = {
            let mut f = Vec::new();
            push(&mut f, raw_header(b"smuggled.jpg", 3, b'0'), b"bad");
            f.resize(1024, 0);
            f
        };
        let pax = pax_data(&[("size", "1024")]);
        for typeflag in [b'0', b'D', b'V'] {
            let mut a = Vec::new();
            push(
                &mut a,
                raw_header(b"././@PaxHeader", pax.len() as u64, b'x'),
                &pax,
            );
            push(&mut a, raw_header(b"skipme", 0, typeflag), &fake);
            push(&mut a, raw_header(b"real.txt", 2, b'0'), b"ok");
            end(&mut a);
            let got = read(&a).unwrap();
            let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
            let want: &[&str] = if typeflag == b'0' {
                &["skipme", "real.txt"]
            } else {
                &["real.txt"]
            };
            assert_eq!(names, want, "typeflag {}", typeflag as char);
            assert_eq!(
                tar_rs(&a)
                    .unwrap()
                    .iter()
                    .map(|(p, _)| p.as_str())
                    .collect::<Vec<_>>(),
                want
            );
        }
        // A pax size on a directory (which carries no data) is refused, not guessed.
        let mut a = Vec::new();
        push(
            &mut a,
            raw_header(b"././@PaxHeader", pax.len() as u64, b'x'),
            &pax,
        );
        push(&mut a, raw_header(b"dir/", 0, b'5'), &fake);
        end(&mut a);
        let e = read(&a).unwrap_err();
        assert!(reason(&e).2.contains("directory"), "{e}");
    }

    #[test]
    fn long_name_applies_to_the_next_member_only() {
        let mut a = Vec::new();
        let name = b"very/long/dir/name/\0";
        let mut l = raw_header(b"././@LongLink", name.len() as u64, b'L');
        l[257..265].copy_from_slice(b"ustar  \0");
        fix_sum(&mut l);
        push(&mut a, l, name);
        push(&mut a, raw_header(b"dir/", 0, b'5'), b"");
        push(&mut a, raw_header(b"file.txt", 1, b'0'), b"f");
        end(&mut a);
        let want = vec![("file.txt".to_string(), b"f".to_vec())];
        assert_eq!(read(&a).unwrap(), want);
        assert_eq!(tar_rs(&a).unwrap(), want);
    }

    #[test]
    fn ambiguous_extension_headers_are_refused() {
        let pax = |recs: &[(&str, &str)]| {
            let d = pax_data(recs);
            (raw_header(b"././@PaxHeader", d.len() as u64, b'x'), d)
        };
        let global = |recs: &[(&str, &str)]| {
            let d = pax_data(recs);
            (raw_header(b"pax_global_header", d.len() as u64, b'g'), d)
        };
        let long = |n: &[u8]| {
            let mut h = raw_header(b"././@LongLink", n.len() as u64, b'L');
            h[257..265].copy_from_slice(b"ustar  \0");
            fix_sum(&mut h);
            (h, n.to_vec())
        };
        let file = (raw_header(b"f.txt", 1, b'0'), b"1".to_vec());
        type Case = (&'static str, Vec<([u8; 512], Vec<u8>)>);
        let cases: Vec<Case> = vec![
            (
                "second pax",
                vec![pax(&[("path", "a")]), pax(&[("path", "b")]), file.clone()],
            ),
            (
                "second GNU long-name",
                vec![long(b"a\0"), long(b"b\0"), file.clone()],
            ),
            (
                "global header between",
                vec![
                    pax(&[("path", "a")]),
                    global(&[("comment", "x")]),
                    file.clone(),
                ],
            ),
            (
                "sets \"size\"",
                vec![global(&[("size", "5")]), file.clone()],
            ),
            (
                "sets \"path\"",
                vec![global(&[("path", "p")]), file.clone()],
            ),
            (
                "differ",
                vec![long(b"one\0"), pax(&[("path", "two")]), file.clone()],
            ),
            (
                "bytes after its terminating NUL",
                vec![long(b"one\0two"), file.clone()],
            ),
            (
                "bytes after its terminating NUL",
                vec![long(b"one\0\0"), file.clone()],
            ),
            (
                "two size records",
                vec![pax(&[("size", "1"), ("size", "1")]), file.clone()],
            ),
            ("not a decimal", vec![pax(&[("size", "+1")]), file.clone()]),
            ("not a decimal", vec![pax(&[("size", "")]), file.clone()]),
            (
                "ends with '/'",
                vec![pax(&[("path", "a.jpg/")]), file.clone()],
            ),
            (
                "sparse",
                vec![pax(&[("GNU.sparse.major", "1")]), file.clone()],
            ),
            ("before any member follows", vec![pax(&[("path", "a")])]),
        ];
        for (want, members) in cases {
            let mut a = Vec::new();
            for (h, d) in &members {
                push(&mut a, *h, d);
            }
            end(&mut a);
            let e = read(&a).expect_err(want);
            let (uri, _, why) = reason(&e);
            assert_eq!(uri, URI);
            assert!(why.contains(want), "{want}: {why}");
        }
        // A global header with harmless keywords (git archive's comment) is fine, and two
        // long names for one member with identical pax path are fine.
        let mut a = Vec::new();
        for (h, d) in [
            global(&[("comment", "abc")]),
            long(b"same.txt\0"),
            pax(&[("path", "same.txt")]),
            file.clone(),
        ] {
            push(&mut a, h, &d);
        }
        end(&mut a);
        assert_eq!(read(&a).unwrap(), [("same.txt".to_string(), b"1".to_vec())]);

        // Malformed pax records.
        for records in [
            &b"5 a=b\n"[..],
            b"6 a=b",
            b"x a=b\n",
            b"6 ab\n\n",
            b"99 a=b\n",
            b"6 a=b\n\0\0",
        ] {
            let mut a = Vec::new();
            push(
                &mut a,
                raw_header(b"p", records.len() as u64, b'x'),
                records,
            );
            push(&mut a, file.0, &file.1);
            end(&mut a);
            let e = read(&a).unwrap_err();
            assert!(reason(&e).2.contains("malformed"), "{records:?}: {e}");
        }
    }

    #[test]
    fn other_refusals() {
        let end_only = |hs: &[[u8; 512]]| {
            let mut a = Vec::new();
            for h in hs {
                a.extend_from_slice(h);
            }
            end(&mut a);
            a
        };
        let e = read(&end_only(&[raw_header(b"link", 5, b'2')])).unwrap_err();
        assert!(reason(&e).2.contains("symbolic link"), "{e}");
        let e = read(&end_only(&[raw_header(b"sparse", 0, b'S')])).unwrap_err();
        assert!(reason(&e).2.contains("sparse"), "{e}");
        let e = read(&end_only(&[raw_header(b"sol", 0, b'X')])).unwrap_err();
        assert!(reason(&e).2.contains("Solaris"), "{e}");
        // A V7 header (no magic) with an extension typeflag.
        let mut h = raw_header(b"v7", 0, b'x');
        h[257..265].fill(0);
        fix_sum(&mut h);
        let e = read(&end_only(&[h])).unwrap_err();
        assert!(reason(&e).2.contains("without ustar or GNU magic"), "{e}");
        // A V7 directory (trailing slash, typeflag NUL) is skipped.
        let mut h = raw_header(b"olddir/", 0, 0);
        h[257..265].fill(0);
        fix_sum(&mut h);
        assert_eq!(read(&end_only(&[h])).unwrap(), []);
        // A bad checksum names the offset; at byte 0 it asks whether this is tar at all.
        let mut a = ours(&[("a.txt", b"a"), ("b.txt", b"b")]);
        a[1024 + 3] ^= 1;
        let e = read(&a).unwrap_err();
        assert_eq!(reason(&e).1, 1024);
        assert!(reason(&e).2.contains("checksum"), "{e}");
        let e = read(
            b"\x1f\x8b gzip, not tar, but long enough to be a block"
                .repeat(20)
                .as_slice(),
        )
        .unwrap_err();
        assert!(reason(&e).2.contains("is this a tar file"), "{e}");
        // Garbage after the end-of-archive block.
        let mut a = ours(&[("a.txt", b"a")]);
        a.extend_from_slice(&ours(&[("b.txt", b"b")]));
        let e = read(&a).unwrap_err();
        assert!(reason(&e).2.contains("after the end-of-archive"), "{e}");
        // Zero padding after it is fine, and so is one zero block.
        let mut a = ours(&[("a.txt", b"a")]);
        a.resize(10240, 0);
        assert_eq!(read(&a).unwrap().len(), 1);
        let a = ours(&[("a.txt", b"a")]);
        assert_eq!(read(&a[..a.len() - 512]).unwrap().len(), 1);
        // A header with too large an extension header.
        let mut h = raw_header(b"p", 2 << 20, b'x');
        h[124..136].copy_from_slice(format!("{:011o}\0", 2u64 << 20).as_bytes());
        fix_sum(&mut h);
        let e = read(&end_only(&[h])).unwrap_err();
        assert!(reason(&e).2.contains("max_header_size"), "{e}");
    }

    #[test]
    fn every_truncation_is_an_error_naming_the_offset() {
        let long = "l".repeat(300);
        let bytes = ours(&[("a.jpg", &[1; 700]), (&long, b"x"), ("b.txt", b"")]);
        // The archive ends with 2 zero blocks: cuts inside the second one keep it complete.
        let complete_from = bytes.len() - 512;
        for cut in 0..bytes.len() {
            let r = read(&bytes[..cut]);
            let s = read_streaming(&bytes[..cut], 100);
            if cut >= complete_from {
                assert_eq!(r.unwrap().len(), 3);
                assert_eq!(s.unwrap().len(), 3);
                continue;
            }
            for e in [r.unwrap_err(), s.unwrap_err()] {
                let (uri, off, why) = reason(&e);
                assert_eq!((uri, off), (URI, cut as u64), "cut {cut}: {why}");
                assert!(why.starts_with("truncated:"), "cut {cut}: {why}");
            }
        }
        let e = read(b"").unwrap_err();
        assert!(reason(&e).2.contains("empty"), "{e}");
    }

    #[test]
    fn fragments_must_end_between_members() {
        let bytes = ours(&[("a.txt", b"aaa"), ("b.txt", b"bbb")]);
        let mut f = TarSlice::fragment(&bytes[..1024], 0, URI, TarOptions::default());
        assert!(f.next_member().unwrap().is_some());
        assert!(f.next_member().unwrap().is_none());
        // Cut in the padding: the member is whole, the range is not.
        let mut f = TarSlice::fragment(&bytes[..1000], 0, URI, TarOptions::default());
        assert!(f.next_member().unwrap().is_some());
        let e = f.next_member().unwrap_err();
        assert!(reason(&e).2.starts_with("truncated:"), "{e}");
        let mut f = TarSlice::fragment(&bytes[1024..2048], 1024, URI, TarOptions::default());
        let (m, d) = f.next_member().unwrap().unwrap();
        assert_eq!(
            (m.path, d, m.header_offset),
            (&b"b.txt"[..], &b"bbb"[..], 1024)
        );
        // A fragment that starts inside data fails the checksum, at the right offset.
        let mut f = TarSlice::fragment(&bytes[512..1536], 512, URI, TarOptions::default());
        let e = f.next_member().unwrap_err();
        assert_eq!(reason(&e).1, 512);
        assert!(f.next_member().unwrap().is_none());
    }

    #[test]
    fn decoder_fails_for_good_after_an_error() {
        let mut a = ours(&[("a.txt", b"a")]);
        a[0] ^= 1;
        let mut d = TarDecoder::new(URI, TarOptions::default());
        assert!(d.decode(&a).is_err());
        assert!(d.decode(&a).is_err());
        assert!(d.finish().is_err());
    }

    #[test]
    fn writer_refuses_bad_paths_and_uses_pax_for_huge_sizes() {
        let mut w = TarWriter::new(Vec::new());
        assert_eq!(
            w.append("", b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            w.append("a\0b", b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(w.position(), 0);
        // A size of 8 GiB or more needs a pax size record (checked without writing it).
        assert_eq!(pax_records("a", 1 << 33), b"19 size=8589934592\n");
        assert_eq!(member_len("a", 1 << 33), 512 + 512 + 512 + (1 << 33));
        assert!(pax_records("a", USTAR_MAX_SIZE).is_empty());
        // Record lengths that cross a power of ten count themselves right.
        for n in 0..300 {
            let mut v = Vec::new();
            pax_record(&mut v, "path", &"p".repeat(n));
            let s = std::str::from_utf8(&v).unwrap();
            let len: usize = s.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(len, v.len());
        }
    }

    /// A small deterministic generator (xorshift) for the differential test.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random archives from the tar crate's builder and ours, then damaged: flipped bytes
    /// in headers (checksum repaired, so the damage reaches the parser), copied typeflags,
    /// cuts. Wherever both readers accept an archive, they must see the same files.
    #[test]
    fn differential_against_the_tar_crate() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut both_ok = 0;
        for round in 0..400 {
            let mut b = ::tar::Builder::new(Vec::new());
            let n = 1 + rng.below(5);
            for i in 0..n {
                let name_len = [5, 99, 100, 101, 150, 300][rng.below(6) as usize];
                let mut path = format!("m{round}-{i}.");
                while path.len() < name_len {
                    path.push(if rng.below(9) == 0 { '/' } else { 'x' });
                }
                let path = path.replace("//", "/x").trim_end_matches('/').to_string();
                let size = [0, 1, 511, 512, 513, 1500][rng.below(6) as usize];
                let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                match rng.below(5) {
                    0 => {
                        // (A long path falls back to a GNU long name; the typeflag must not
                        // stay NUL, or a truncated name ending in '/' reads as a V7
                        // directory in Python's tarfile and here.)
                        let mut h = ::tar::Header::new_ustar();
                        h.set_entry_type(::tar::EntryType::Regular);
                        h.set_size(size as u64);
                        let _ = b.append_data(&mut h, &path, &data[..]);
                    }
                    1 => {
                        let records = pax_data(&[("path", &path), ("size", &size.to_string())]);
                        let mut h = ::tar::Header::new_ustar();
                        h.set_entry_type(::tar::EntryType::XHeader);
                        h.set_size(records.len() as u64);
                        b.append_data(&mut h, "PaxHeader", &records[..]).unwrap();
                        let mut h = ::tar::Header::new_ustar();
                        h.set_path("cut").unwrap();
                        h.set_size(if rng.below(2) == 0 { 0 } else { size as u64 });
                        h.set_cksum();
                        b.append(&h, &data[..]).unwrap();
                    }
                    2 => {
                        let mut h = ::tar::Header::new_gnu();
                        h.set_entry_type(::tar::EntryType::Directory);
                        h.set_size(0);
                        b.append_data(&mut h, format!("dir{i}/"), std::io::empty())
                            .unwrap();
                    }
                    _ => {
                        let mut h = ::tar::Header::new_gnu();
                        h.set_entry_type(::tar::EntryType::Regular);
                        h.set_size(size as u64);
                        b.append_data(&mut h, &path, &data[..]).unwrap();
                    }
                }
            }
            let clean = b.into_inner().unwrap();
            let ours_clean = read(&clean).unwrap();
            assert_eq!(ours_clean, tar_rs(&clean).unwrap(), "round {round}");

            for _ in 0..20 {
                let mut a = clean.clone();
                let blocks = a.len() / 512;
                match rng.below(4) {
                    0 => {
                        let cut = rng.below(a.len() as u64 + 1) as usize;
                        a.truncate(cut);
                    }
                    _ => {
                        // Damage a header block (most blocks are headers in these archives),
                        // then repair its checksum so the parser sees the damage.
                        let blk = rng.below(blocks as u64) as usize * 512;
                        let pos = blk
                            + [0, 99, 124, 130, 135, 156, 257, 263, 345, 400, 0]
                                [rng.below(11) as usize]
                            + rng.below(4) as usize;
                        let pos = pos.min(blk + 511);
                        a[pos] = match rng.below(5) {
                            0 => 0,
                            1 => b'0' + rng.below(10) as u8,
                            2 => b"xgLK0257 /\x80"[rng.below(11) as usize],
                            _ => rng.next() as u8,
                        };
                        if rng.below(4) != 0 {
                            fix_sum(&mut a[blk..blk + 512]);
                        }
                    }
                }
                let (mine, theirs) = (read(&a), tar_rs(&a));
                if let (Ok(m), Ok(t)) = (&mine, &theirs) {
                    both_ok += 1;
                    assert_eq!(
                        m, t,
                        "round {round}: both read the damaged archive differently"
                    );
                }
                // The streaming decoder always agrees with the slice reader.
                match (&mine, read_streaming(&a, 1 + rng.below(700) as usize)) {
                    (Ok(m), Ok(s)) => assert_eq!(m, &s),
                    (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string()),
                    (x, y) => panic!("round {round}: slice {x:?} vs streaming {y:?}"),
                }
            }
        }
        assert!(
            both_ok > 1000,
            "only {both_ok} damaged archives were read by both"
        );
    }
}
