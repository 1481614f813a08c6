//! Helpers shared by the crate's unit tests.

use chute_core::Error;

/// The parts of an [`Error::Corrupt`]: uri, offset and reason; panics on any other error.
pub(crate) fn corrupt(e: Error) -> (String, u64, String) {
    match e {
        Error::Corrupt {
            uri,
            offset,
            reason,
            ..
        } => (uri, offset, reason),
        other => panic!("expected a corrupt error, got {other}"),
    }
}
