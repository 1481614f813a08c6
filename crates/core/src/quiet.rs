//! Panics of third-party decoders on hostile bytes, caught without a message on stderr.
//!
//! A decoder chute does not own (arrow-rs on a corrupt page, say) may panic on bytes it was
//! never meant to see. That is a bad file, not a crash: the caller turns it into a data
//! error naming the file. [`catch_quietly`] catches the panic and keeps the default hook from
//! printing `thread ... panicked at` for it (a user reading their own data should see one
//! clear error, not a Rust backtrace note); every other panic still reaches the hook that
//! was installed before, as it would have.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// How many [`catch_quietly`] calls this thread is inside.
    static QUIET: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`; a panic inside it becomes `Err` with the panic's message, and is not printed.
///
/// ```
/// let r = chute_core::quiet::catch_quietly(|| -> u32 { panic!("bad page") });
/// assert_eq!(r.unwrap_err(), "bad page");
/// ```
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(q.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(q.get() - 1));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string())
    })
}
