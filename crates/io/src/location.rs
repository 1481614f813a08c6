//! [`Location`]: where a shard, an index or a manifest lives: a local path or a URL.

use std::fmt;
use std::path::{Path, PathBuf};

use chute_core::{ConfigError, Error};

/// The URL schemes chute reads, besides local paths.
pub const SCHEMES: &[&str] = &[
    "file", "http", "https", "s3", "s3a", "gs", "az", "abfs", "abfss",
];

/// Where bytes live: a local file, or an object behind a URL.
///
/// Parsed from what a user writes ([`Location::parse`]): `s3://bucket/train-000.tar`,
/// `gs://...`, `az://container/...` (and `abfs[s]://`), `http(s)://host/path`, `file:///abs/path`
/// or a plain path. `file://` URLs become local paths, so they are memory-mapped like any
/// local file. Anything else with a `scheme://` prefix is refused with the list of schemes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A path on this machine.
    Local(PathBuf),
    /// A URL (`scheme://authority/key`), kept as the user wrote it.
    Remote(String),
}

impl Location {
    /// Parses a path or URL. Fails with a [`ConfigError`] naming the text for an unknown
    /// scheme, or a `file://` URL that is not absolute.
    pub fn parse(text: &str) -> Result<Location, ConfigError> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(text)));
        };
        // A Windows path such as `C:\x` has no "://"; anything else before "://" that is not
        // a scheme name (`a/b://c`) is a path too.
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
        {
            return Ok(Location::Local(PathBuf::from(text)));
        }
        let lower = scheme.to_ascii_lowercase();
        if lower == "file" {
            if !rest.starts_with('/') {
                return Err(ConfigError::new(
                    "path",
                    format!("{text:?}: a file:// URL needs an absolute path (file:///data/x.tar)"),
                ));
            }
            return Ok(Location::Local(PathBuf::from(rest)));
        }
        if !SCHEMES.contains(&lower.as_str()) {
            return Err(ConfigError::new(
                "path",
                format!(
                    "{text:?}: unknown URL scheme {scheme:?}; chute reads local paths, file://, \
                     http://, https://, s3://, gs:// and az://"
                ),
            ));
        }
        let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() || key.is_empty() {
            return Err(ConfigError::new(
                "path",
                format!(
                    "{text:?}: a URL must name a host or bucket and an object \
                     ({lower}://bucket/path/to/shard)"
                ),
            ));
        }
        Ok(Location::Remote(text.to_owned()))
    }

    /// [`Location::parse`] of a [`Path`] (a URL held in a `PathBuf`, as the format readers
    /// take them). Non-UTF-8 paths are local.
    pub fn from_path(path: &Path) -> Result<Location, ConfigError> {
        match path.to_str() {
            Some(s) => Location::parse(s),
            None => Ok(Location::Local(path.to_path_buf())),
        }
    }

    /// Whether the bytes are behind a URL (and need fetching).
    pub fn is_remote(&self) -> bool {
        matches!(self, Location::Remote(_))
    }

    /// The location of `name` relative to this one's folder: a manifest's shard paths are
    /// relative to the manifest. An absolute path or a URL in `name` is returned as is.
    pub fn join_sibling(&self, name: &str) -> Result<Location, ConfigError> {
        let parsed = Location::parse(name)?;
        match (&parsed, self) {
            (Location::Remote(_), _) => Ok(parsed),
            (Location::Local(p), _) if p.is_absolute() => Ok(parsed),
            (Location::Local(p), Location::Local(me)) => Ok(Location::Local(
                me.parent().unwrap_or(Path::new(".")).join(p),
            )),
            (Location::Local(_), Location::Remote(url)) => {
                let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
                let name = name.strip_prefix("./").unwrap_or(name);
                Ok(Location::Remote(format!("{base}/{name}")))
            }
        }
    }

    /// This location with `suffix` appended (`<shard>.idx`).
    pub fn with_suffix(&self, suffix: &str) -> Location {
        match self {
            Location::Local(p) => {
                let mut s = p.clone().into_os_string();
                s.push(suffix);
                Location::Local(PathBuf::from(s))
            }
            Location::Remote(u) => Location::Remote(format!("{u}{suffix}")),
        }
    }

    /// The file name: the last path component or URL segment.
    pub fn file_name(&self) -> String {
        match self {
            Location::Local(p) => p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            Location::Remote(u) => u.rsplit('/').next().unwrap_or(u).to_owned(),
        }
    }

    /// Reads the whole file or object: a memory map for a local file, a fetch (with retries)
    /// for a URL. `Ok(None)` if it does not exist (404, or no such file).
    pub fn read_optional(&self) -> Result<Option<bytes::Bytes>, Error> {
        match self {
            Location::Local(p) => {
                if !p.exists() {
                    return Ok(None);
                }
                let f = crate::MappedFile::open(p)?;
                Ok(Some(f.bytes(0..f.len())))
            }
            #[cfg(feature = "remote")]
            Location::Remote(url) => crate::remote::fetch_optional(url),
            #[cfg(not(feature = "remote"))]
            Location::Remote(url) => Err(no_remote(url)),
        }
    }

    /// Reads the whole file or object; a missing one is an [`Error::Io`] of kind `NotFound`
    /// naming it.
    pub fn read(&self) -> Result<bytes::Bytes, Error> {
        self.read_optional()?.ok_or_else(|| {
            Error::io(
                self.to_string(),
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or object"),
            )
        })
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote(u) => f.write_str(u),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// The error for a URL in a build without the `remote` feature.
#[cfg(not(feature = "remote"))]
pub(crate) fn no_remote(url: &str) -> chute_core::Error {
    chute_core::Error::io(
        url,
        std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this build of chute reads local files only; rebuild with the `remote` feature",
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_and_urls() {
        assert_eq!(
            Location::parse("data/x.tar").unwrap(),
            Location::Local("data/x.tar".into())
        );
        assert_eq!(
            Location::parse("file:///data/x.tar").unwrap(),
            Location::Local("/data/x.tar".into())
        );
        for url in [
            "s3://b/k.tar",
            "gs://b/k.tar",
            "az://c/k.tar",
            "http://127.0.0.1:8080/d/k.tar",
            "HTTPS://h/k",
        ] {
            assert_eq!(Location::parse(url).unwrap(), Location::Remote(url.into()));
        }
        let e = Location::parse("ftp://h/x").unwrap_err().to_string();
        assert!(
            e.contains("unknown URL scheme \"ftp\"") && e.contains("s3://"),
            "{e}"
        );
        let e = Location::parse("file://rel/x").unwrap_err().to_string();
        assert!(e.contains("absolute"), "{e}");
        let e = Location::parse("s3://bucket").unwrap_err().to_string();
        assert!(e.contains("bucket and an object"), "{e}");
        assert!(!Location::parse("a/b://c").unwrap().is_remote());
    }

    #[test]
    fn joins_siblings() {
        let m = Location::parse("s3://b/data/manifest.json").unwrap();
        assert_eq!(
            m.join_sibling("x-0.tar").unwrap().to_string(),
            "s3://b/data/x-0.tar"
        );
        assert_eq!(
            m.join_sibling("./x.tar").unwrap().to_string(),
            "s3://b/data/x.tar"
        );
        assert_eq!(
            m.join_sibling("gs://o/y.tar").unwrap().to_string(),
            "gs://o/y.tar"
        );
        let l = Location::parse("/d/manifest.json").unwrap();
        assert_eq!(l.join_sibling("x.tar").unwrap().to_string(), "/d/x.tar");
        assert_eq!(
            m.with_suffix(".idx").to_string(),
            "s3://b/data/manifest.json.idx"
        );
        assert_eq!(m.file_name(), "manifest.json");
        assert_eq!(l.file_name(), "manifest.json");
    }
}
