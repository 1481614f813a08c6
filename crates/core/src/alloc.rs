//! [`CachingAlloc`]: the system allocator, keeping freed large blocks for reuse.
//!
//! Decoders allocate a fresh buffer for each large piece they decode (an Arrow array per
//! Parquet column chunk, an image's pixels) and free it soon after. glibc serves blocks that
//! large from fresh mappings or trims them from its heaps when freed, so every such buffer
//! costs the kernel a page fault and a zeroed page per 4 KiB touched: a tenth of a Parquet
//! epoch's time went there. This allocator keeps up to [`PER_CLASS`] freed blocks of each
//! power-of-two size class from [`MIN_CACHED`] to [`MAX_CACHED`] bytes (at most
//! [`CACHE_LIMIT`] bytes in all) and hands them out again, their pages already mapped.
//! Everything else goes straight to the inner allocator: mimalloc with the feature
//! `mimalloc` (the facade turns it on by default; glibc's malloc was 40% of a chat
//! tokenization's time, many small blocks from several threads), else the system's. The lists are only ever tried,
//! never waited on: a list another thread is using at that instant, or one a thread held when
//! the process forked (which no thread in the child will release), is passed by.
//!
//! It is the global allocator of the `chute` binary and of the Python extension (Rust code
//! only: Python's and numpy's allocations are not affected):
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: chute_core::alloc::CachingAlloc = chute_core::alloc::CachingAlloc;
//! ```

use std::alloc::{GlobalAlloc, Layout};

/// What serves the blocks not cached: mimalloc (feature `mimalloc`), else the system's.
#[cfg(feature = "mimalloc")]
use mimalloc::MiMalloc as System;
#[cfg(not(feature = "mimalloc"))]
use std::alloc::System;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Smallest block size kept (smaller ones are reused well by the system allocator).
pub const MIN_CACHED: usize = 256 << 10;
/// Largest block size kept.
pub const MAX_CACHED: usize = 64 << 20;
/// Freed blocks kept per size class.
pub const PER_CLASS: usize = 32;
/// Most bytes kept in all.
pub const CACHE_LIMIT: usize = 256 << 20;

/// Alignment of every cached block (a page: enough for any layout this allocator caches).
const BLOCK_ALIGN: usize = 4096;

const CLASSES: usize = (MAX_CACHED.trailing_zeros() - MIN_CACHED.trailing_zeros() + 1) as usize;

/// Freed blocks per size class (addresses; a `Mutex<Vec>` is const-constructible and its lock
/// never allocates, but its `Vec` would: each list is a fixed array instead).
struct Class {
    blocks: [usize; PER_CLASS],
    len: usize,
}

static CACHE: [Mutex<Class>; CLASSES] = [const {
    Mutex::new(Class {
        blocks: [0; PER_CLASS],
        len: 0,
    })
}; CLASSES];

static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, keeping freed blocks of 256 KiB to 64 MiB for reuse (see the
/// module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct CachingAlloc;

/// The size class of `layout`, when it is one this allocator caches.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    if !(MIN_CACHED..=MAX_CACHED).contains(&size) || layout.align() > BLOCK_ALIGN {
        return None;
    }
    let rounded = size.next_power_of_two();
    Some((rounded.trailing_zeros() - MIN_CACHED.trailing_zeros()) as usize)
}

/// Class `c`'s list, unless another thread holds it.
fn try_lock(c: usize) -> Option<std::sync::MutexGuard<'static, Class>> {
    match CACHE[c].try_lock() {
        Ok(list) => Some(list),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

fn block_layout(class: usize) -> Layout {
    // Sizes are powers of two below 2^27 and the alignment a page: always a valid layout.
    Layout::from_size_align(MIN_CACHED << class, BLOCK_ALIGN).expect("a valid block layout")
}

// SAFETY: every block handed out is either the system allocator's for the same layout, or a
// block of the same size class (the same `block_layout`) that the system allocator returned
// and that was freed by its owner before being kept; blocks are at least as large and as
// aligned as the layout asked for.
unsafe impl GlobalAlloc for CachingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            // SAFETY: forwarded as it came.
            return unsafe { System.alloc(layout) };
        };
        // `try_lock`: a list another thread is using (or that a thread held when the process
        // forked, and never lets go of in the child) is passed by, never waited on.
        if let Some(mut list) = try_lock(c)
            && list.len > 0
        {
            list.len -= 1;
            let block = list.blocks[list.len];
            CACHED_BYTES.fetch_sub(MIN_CACHED << c, Ordering::Relaxed);
            return block as *mut u8;
        }
        // SAFETY: a valid, non-zero-sized layout.
        unsafe { System.alloc(block_layout(c)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else {
            // SAFETY: allocated by `System` with this layout (see `alloc`).
            return unsafe { System.dealloc(ptr, layout) };
        };
        let size = MIN_CACHED << c;
        if CACHED_BYTES.load(Ordering::Relaxed) + size <= CACHE_LIMIT
            && let Some(mut list) = try_lock(c)
            && list.len < PER_CLASS
        {
            let n = list.len;
            list.blocks[n] = ptr as usize;
            list.len += 1;
            CACHED_BYTES.fetch_add(size, Ordering::Relaxed);
            return;
        }
        // SAFETY: blocks of class `c` come from `System` with `block_layout(c)`.
        unsafe { System.dealloc(ptr, block_layout(c)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract: `layout.align()` with `new_size` is a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new)) {
            (None, None) => {
                // SAFETY: a `System` block of `layout`, resized by `System`.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
            (Some(a), Some(b)) if a == b => ptr,
            _ => {
                // SAFETY: a fresh block of the new layout; the old one is live for `layout`.
                let out = unsafe { self.alloc(new) };
                if !out.is_null() {
                    // SAFETY: both blocks hold at least the smaller size; they do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, out, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_reused_and_everything_round_trips() {
        let a = CachingAlloc;
        let big = Layout::from_size_align(300 << 10, 64).unwrap();
        // SAFETY: layouts are valid and non-zero; each block is freed once, with its layout.
        unsafe {
            let p = a.alloc(big);
            assert!(!p.is_null() && (p as usize).is_multiple_of(64));
            p.write_bytes(7, big.size());
            a.dealloc(p, big);
            // The same class (512 KiB) gives the block back.
            let q = a.alloc(Layout::from_size_align(400 << 10, 128).unwrap());
            assert_eq!(q, p);
            // Growing within the class keeps the block; past it moves, keeping the bytes.
            let q2 = a.realloc(
                q,
                Layout::from_size_align(400 << 10, 128).unwrap(),
                500 << 10,
            );
            assert_eq!(q2, q);
            let r = a.realloc(
                q2,
                Layout::from_size_align(500 << 10, 128).unwrap(),
                2 << 20,
            );
            assert_eq!(*r, 7);
            a.dealloc(r, Layout::from_size_align(2 << 20, 128).unwrap());
            let small = Layout::from_size_align(100, 8).unwrap();
            let s = a.alloc(small);
            let s = a.realloc(s, small, 1 << 20);
            a.dealloc(s, Layout::from_size_align(1 << 20, 8).unwrap());
            let huge = Layout::from_size_align(100 << 20, 64).unwrap();
            let h = a.alloc(huge);
            a.dealloc(h, huge);
        }
        assert!(CACHED_BYTES.load(Ordering::Relaxed) <= CACHE_LIMIT);
    }
}
