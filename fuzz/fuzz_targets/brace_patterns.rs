//! Brace patterns (`expand_braces`): any text either is refused with a clear error or expands
//! to at most the limit's names, none longer than the pattern; never a panic, and never
//! gigabytes of names. The limit is 4,096 names here (`expand_braces_at_most`; the same code
//! as `MAX_EXPANSIONS` everywhere else), so an execution stays cheap.

#![no_main]

use chute_formats::webdataset::expand_braces_at_most;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Ok(pattern) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(names) = expand_braces_at_most(pattern, MAX) else {
        return;
    };
    assert!(names.len() <= MAX);
    assert!(names.iter().all(|n| n.len() <= pattern.len()), "a name longer than {pattern:?}");
});
