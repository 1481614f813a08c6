//! [`RemoteOptions`]: read-ahead, retries, timeouts and the node-local cache.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use chute_core::ConfigError;

/// How remote shards are read. Process-wide ([`set_remote_options`]); sources take the
/// options in force when they are opened. Defaults come from the environment
/// ([`RemoteOptions::from_env`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoteOptions {
    /// Whole shards of this rank fetched ahead of the one being read (`CHUTE_READ_AHEAD`,
    /// default 2). Memory holds at most the shards being read plus these.
    pub read_ahead: usize,
    /// Attempts per request before giving up, the first included (`CHUTE_RETRIES` + 1,
    /// default 10 attempts).
    pub max_attempts: u32,
    /// Time one fetch may spend retrying, over all its attempts (`CHUTE_RETRY_BUDGET`
    /// seconds, default 300).
    pub retry_budget: Duration,
    /// First backoff; it doubles per retry up to [`RemoteOptions::backoff_max`], and each
    /// sleep is drawn uniformly from half to all of it (jitter). Default 100 ms.
    pub backoff_base: Duration,
    /// Longest backoff (default 10 s).
    pub backoff_max: Duration,
    /// A request whose response headers, or whose next body bytes, take longer than this is
    /// abandoned and retried from the byte reached (`CHUTE_TIMEOUT` seconds, default 30).
    pub timeout: Duration,
    /// The node-local cache directory (`CHUTE_CACHE_DIR`; default none).
    pub cache_dir: Option<PathBuf>,
    /// The cache's size limit in bytes (`CHUTE_CACHE_LIMIT`, with an optional K/M/G/T
    /// suffix; default 64 GiB).
    pub cache_limit: u64,
    /// Threads of the I/O runtime (default 2): network I/O only, never decoding.
    pub io_threads: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            read_ahead: 2,
            max_attempts: 10,
            retry_budget: Duration::from_secs(300),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            cache_dir: None,
            cache_limit: 64 << 30,
            io_threads: 2,
        }
    }
}

impl RemoteOptions {
    /// The defaults, overridden by `CHUTE_READ_AHEAD`, `CHUTE_RETRIES`, `CHUTE_RETRY_BUDGET`,
    /// `CHUTE_TIMEOUT`, `CHUTE_CACHE_DIR` and `CHUTE_CACHE_LIMIT` where set. A value that does
    /// not parse is a [`ConfigError`] naming the variable.
    pub fn from_env() -> Result<RemoteOptions, ConfigError> {
        let mut o = RemoteOptions::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let num = |name: &str, v: String| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| *x >= 0.0 && x.is_finite())
                .ok_or_else(|| {
                    ConfigError::new(name, format!("{v:?} is not a non-negative number"))
                })
        };
        if let Some(v) = var("CHUTE_READ_AHEAD") {
            o.read_ahead = num("CHUTE_READ_AHEAD", v)? as usize;
        }
        if let Some(v) = var("CHUTE_RETRIES") {
            o.max_attempts = num("CHUTE_RETRIES", v)? as u32 + 1;
        }
        if let Some(v) = var("CHUTE_RETRY_BUDGET") {
            o.retry_budget = Duration::from_secs_f64(num("CHUTE_RETRY_BUDGET", v)?);
        }
        if let Some(v) = var("CHUTE_TIMEOUT") {
            o.timeout = Duration::from_secs_f64(num("CHUTE_TIMEOUT", v)?.max(0.001));
        }
        if let Some(v) = var("CHUTE_CACHE_DIR") {
            o.cache_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = var("CHUTE_CACHE_LIMIT") {
            o.cache_limit =
                parse_size(&v).map_err(|why| ConfigError::new("CHUTE_CACHE_LIMIT", why))?;
        }
        Ok(o)
    }
}

/// A byte count with an optional binary suffix: `500000`, `512K`, `20G`, `1.5T`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'B' => 0,
                _ => {
                    return Err(format!(
                        "{text:?}: unknown size suffix {c:?} (use K, M, G or T)"
                    ));
                }
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size (a number of bytes, or 512K, 20G, 1.5T)"))?;
    if !(n >= 0.0 && n.is_finite()) {
        return Err(format!("{text:?} is not a size"));
    }
    Ok((n * (1u64 << shift) as f64) as u64)
}

static OPTIONS: Mutex<Option<RemoteOptions>> = Mutex::new(None);

/// Sets the process-wide [`RemoteOptions`] for sources opened from now on.
pub fn set_remote_options(options: RemoteOptions) {
    *OPTIONS.lock().unwrap_or_else(|p| p.into_inner()) = Some(options);
}

/// The process-wide [`RemoteOptions`]: what [`set_remote_options`] set, else
/// [`RemoteOptions::from_env`].
pub fn remote_options() -> Result<RemoteOptions, ConfigError> {
    let mut o = OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(o) = &*o {
        return Ok(o.clone());
    }
    let env = RemoteOptions::from_env()?;
    *o = Some(env.clone());
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5T").unwrap(), 3 << 39);
        assert!(parse_size("12Q").unwrap_err().contains("suffix"));
        assert!(parse_size("lots").is_err());
    }
}
