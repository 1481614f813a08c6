//! Brace patterns (`expand_braces`): any text either is refused with a clear error or expands
//! to at most `MAX_EXPANSIONS` names, none longer than the pattern; never a panic, and never
//! gigabytes of names.

#![no_main]

use chute_formats::webdataset::expand_braces;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(pattern) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(names) = expand_braces(pattern) else {
        return;
    };
    assert!(names.len() <= chute_formats::webdataset::MAX_EXPANSIONS);
    assert!(names.iter().all(|n| n.len() <= pattern.len()), "a name longer than {pattern:?}");
});
