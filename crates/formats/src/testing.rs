//! Test support (feature `testing`): helpers shared by the tests of the formats and of the
//! crates built on them.

pub use chute_core::testing::corrupt;

/// WebDataset shards of random bytes for tests, with index files: shard `i` is
/// `{stem}-{i:02}.tar` in `dir` (made if missing), holding `counts[i]` samples keyed `k00000`,
/// `k00001`... (numbered across shards), each a `bin` member of 100 to 3,099 random bytes and a
/// `cls` member (the sample's number modulo 10), all drawn from `seed`. Returns the shards'
/// paths, in order.
pub fn random_webdataset(
    dir: &std::path::Path,
    stem: &str,
    counts: &[u64],
    seed: u64,
) -> Vec<std::path::PathBuf> {
    use crate::webdataset::{ShardWriter, ShardWriterOptions};
    std::fs::create_dir_all(dir).expect("the shards' folder");
    let pattern = dir.join(format!("{stem}-%02d.tar"));
    let mut rng = chute_core::SampleRng::from_key(seed);
    let mut paths = Vec::new();
    let mut key = 0u64;
    for (i, &n) in counts.iter().enumerate() {
        let options = ShardWriterOptions {
            max_count: n.max(1),
            start_shard: i as u64,
            write_index: true,
            ..ShardWriterOptions::default()
        };
        let mut w = ShardWriter::new(pattern.to_str().expect("a UTF-8 path"), options)
            .expect("a shard writer");
        for _ in 0..n {
            let data: Vec<u8> = (0..100 + rng.below(3000))
                .map(|_| rng.next_u64() as u8)
                .collect();
            let cls = (key % 10).to_string();
            w.write(
                &format!("k{key:05}"),
                &[("bin", &data), ("cls", cls.as_bytes())],
            )
            .expect("a sample written");
            key += 1;
        }
        paths.extend(
            w.finish()
                .expect("shards written")
                .into_iter()
                .map(|s| s.path.into()),
        );
    }
    paths
}
