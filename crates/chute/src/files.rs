//! The file reader the decode ops use for values that name a file (see
//! [`chute_core::files`]): chute's I/O layer, so a manifest's URLs (HTTP(S), S3, GCS, Azure)
//! are read as shards are, with their retries, credentials and node-local cache.

/// Installs chute's I/O layer as the process's reader of files named by values (a manifest's
/// paths and URLs): call it once before reading; the command line and the Python package do.
/// Without it, the decode ops read local paths and refuse URLs.
pub fn read_files_with_io() {
    chute_core::files::set_file_reader(read);
}

fn read(name: &str) -> Result<bytes::Bytes, String> {
    let location = chute_io::Location::parse(name).map_err(|e| e.to_string())?;
    if !location.is_remote() {
        let path = name.strip_prefix("file://").unwrap_or(name);
        return std::fs::read(path)
            .map(bytes::Bytes::from)
            .map_err(|e| e.to_string());
    }
    let set = chute_io::ShardSet::open(&[location]).map_err(|e| e.to_string())?;
    set.get(0).map_err(|e| e.to_string())
}
