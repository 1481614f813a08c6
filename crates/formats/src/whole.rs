//! [`open_whole`]: files read whole, for sources that read files in place.

/// The whole contents of each of `paths` (local paths or URLs, see [`chute_io::Location`]),
/// with its name: a view of the memory map for a local file (advised for random access when
/// `random`), or the object downloaded whole (through the node-local cache, if one is set)
/// for a URL. For sources that read files in place rather than streaming them as shards.
pub fn open_whole<P: AsRef<std::path::Path>>(
    paths: &[P],
    random: bool,
) -> Result<Vec<(String, bytes::Bytes)>, chute_core::Error> {
    let locations = paths
        .iter()
        .map(|p| chute_io::Location::from_path(p.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let set = chute_io::ShardSet::open(&locations)?;
    (0..set.len())
        .map(|i| {
            if let Some(map) = set.mapped(i) {
                // Either way: a map shared with an earlier source keeps its advice.
                if random {
                    map.advise_random();
                } else {
                    map.advise_normal();
                }
                return Ok((set.uri(i).to_string(), map.bytes(0..map.len())));
            }
            Ok((set.uri(i).to_string(), set.get(i)?))
        })
        .collect()
}
