//! Files a value names (a manifest's path or URL, a Hugging Face `Audio` cell of a file left
//! in place), read when an op decodes them. Core does no I/O: it holds only the reader the
//! facade installs ([`set_file_reader`]: local paths and every URL scheme chute's I/O layer
//! reads), so the ops layer reads files without depending on the I/O layer. Without one
//! installed, the ops read local paths themselves and refuse URLs, saying what to call.

use std::sync::OnceLock;

/// Reads a whole file, local path or URL; the error says what failed.
pub type ReadFile = fn(&str) -> Result<bytes::Bytes, String>;

static READER: OnceLock<ReadFile> = OnceLock::new();

/// Installs the process's file reader; the first one installed stays (gives whether this one
/// was).
pub fn set_file_reader(read: ReadFile) -> bool {
    READER.set(read).is_ok()
}

/// The installed file reader, if any.
pub fn file_reader() -> Option<ReadFile> {
    READER.get().copied()
}
