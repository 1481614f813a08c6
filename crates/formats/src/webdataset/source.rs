//! [`WebDatasetSource`]: WebDataset shards as a [`Source`], random access through each shard's
//! [`ShardIndex`].

use std::path::Path;

use chute_core::{ConfigError, Error, Manifest, Plan, Sample, ShardInfo, Source};
use chute_io::{IoSnapshot, ShardSet};

use super::group::read_span;
use super::index::{ShardIndex, TarShards};
use crate::indexed::{self, IndexedShards};
use crate::tar::TarOptions;

/// The manifest's format name.
pub const FORMAT: &str = crate::Format::WebDataset.name();

pub use crate::IndexMode;

/// How a [`WebDatasetSource`] opens shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebDatasetOptions {
    /// Where indexes come from.
    pub index: IndexMode,
    /// Limits for the tar decoder.
    pub tar: TarOptions,
}

#[derive(Debug)]
struct OpenShard {
    uri: String,
    index: ShardIndex,
}

/// WebDataset shards as a [`Source`]: one shard per tar file or object, random access to
/// every sample through each shard's [`ShardIndex`].
///
/// Local files are memory-mapped read-only and never read whole: [`Source::read`] decodes
/// only the sample's range, and its fields are views of the map. Remote shards (URLs, see
/// [`chute_io::Location`]) come through a [`ShardSet`]: streamed whole with read-ahead when
/// the loader gives the rank's shard order ([`Source::set_plan`]), else read by range
/// requests. The manifest's format is [`FORMAT`]; each shard's byte size is the file's.
#[derive(Debug)]
pub struct WebDatasetSource {
    shards: Vec<OpenShard>,
    files: ShardSet,
    manifest: Manifest,
    options: WebDatasetOptions,
}

impl WebDatasetSource {
    /// Opens `paths` (local paths or URLs), one shard each, in order, with each shard's index
    /// from [`WebDatasetOptions::index`] (`<shard>.idx` next to the shard, fetched for a URL).
    ///
    /// A remote shard without an index is downloaded once at open to be scanned; write
    /// indexes with `chute index` so that opening fetches only them.
    ///
    /// Fails with a [`ConfigError`] if `paths` is empty or names an unknown URL scheme;
    /// [`Error::Io`] if a shard cannot be opened or fetched, or (of kind `NotFound`, naming
    /// the index file) if [`IndexMode::Require`] is set and an index file is missing;
    /// [`Error::Corrupt`] naming the shard or index file if a scan finds a damaged shard or
    /// an index file is malformed or does not fit its shard.
    pub fn open<P: AsRef<Path>>(
        paths: &[P],
        options: WebDatasetOptions,
    ) -> Result<WebDatasetSource, Error> {
        if paths.is_empty() {
            return Err(ConfigError::new("paths", "no shards given; pass at least one").into());
        }
        let IndexedShards { files, indexes } =
            IndexedShards::open(paths, options.index, &TarShards(options.tar))?;
        let mut shards = Vec::with_capacity(indexes.len());
        let mut infos = Vec::with_capacity(indexes.len());
        for (i, index) in indexes.into_iter().enumerate() {
            let uri = files.uri(i).to_owned();
            infos.push(ShardInfo {
                path: uri.clone(),
                samples: index.len() as u64,
                bytes: files.size(i),
            });
            shards.push(OpenShard { uri, index });
        }
        Ok(WebDatasetSource {
            shards,
            files,
            manifest: Manifest::new(FORMAT, infos),
            options,
        })
    }

    /// What reading remote shards has cost so far (zero for local shards).
    pub fn io_stats(&self) -> IoSnapshot {
        self.files.stats()
    }

    /// The index of shard `shard` (manifest order).
    ///
    /// # Panics
    /// If `shard` is out of range.
    pub fn shard_index(&self, shard: usize) -> &ShardIndex {
        &self.shards[shard].index
    }

    /// The options the shards were opened with.
    pub fn options(&self) -> WebDatasetOptions {
        self.options
    }
}

impl Source for WebDatasetSource {
    fn remote_io(&self) -> Option<IoSnapshot> {
        Some(self.io_stats())
    }

    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Sample `id`: `__key__` then the fields sorted by name, viewing the map. Fails with
    /// [`Error::Config`] if `id` is out of range, [`Error::Corrupt`] naming the shard if the
    /// sample's bytes are damaged or the index does not match the shard.
    fn read(&self, id: u64) -> Result<Sample, Error> {
        let (shard, pos) = self.manifest.locate_checked(id)?;
        let s = &self.shards[shard];
        let span = s.index.spans[pos as usize];
        let bytes = self.files.get_range(shard, span.range())?;
        let mut sample = read_span(&bytes, span, &s.uri, self.options.tar)?;
        sample.index = id;
        Ok(sample)
    }

    /// Streams remote shards in the plan's shard order, whole and with read-ahead, when the
    /// plan reads them in order; otherwise remote samples are read by range.
    fn set_plan(&self, plan: &Plan) {
        indexed::set_plan(&self.files, &self.manifest, plan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use bytes::Bytes;
    use chute_core::Field;

    use crate::webdataset::testing::{Plain, plain};
    use crate::webdataset::{Samples, ShardWriter, ShardWriterOptions, index_path};

    #[test]
    fn source_reads_shards_with_and_without_index_files() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("s-%04d.tar");
        let mut w = ShardWriter::new(
            pattern.to_str().unwrap(),
            ShardWriterOptions {
                max_count: 3,
                write_index: true,
                ..ShardWriterOptions::default()
            },
        )
        .unwrap();
        for i in 0..7u8 {
            w.write(
                &format!("k{i}"),
                &[("cls", &[b'0' + i]), ("jpg", &vec![i; 100 * i as usize])],
            )
            .unwrap();
        }
        let shards = w.finish().unwrap();
        let names: Vec<_> = shards
            .iter()
            .map(|s| {
                Path::new(&s.path)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["s-0000.tar", "s-0001.tar", "s-0002.tar"]);
        assert_eq!(
            shards.iter().map(|s| s.samples).collect::<Vec<_>>(),
            [3, 3, 1]
        );
        for s in &shards {
            assert_eq!(std::fs::metadata(&s.path).unwrap().len(), s.bytes);
            assert!(index_path(Path::new(&s.path)).exists());
        }
        let paths: Vec<_> = shards.iter().map(|s| s.path.clone()).collect();
        let mut manifests = Vec::new();
        for mode in [IndexMode::Auto, IndexMode::Require, IndexMode::Scan] {
            let src = WebDatasetSource::open(
                &paths,
                WebDatasetOptions {
                    index: mode,
                    ..WebDatasetOptions::default()
                },
            )
            .unwrap();
            assert_eq!(src.manifest().total_samples(), 7);
            assert_eq!(src.manifest().format, "webdataset");
            for id in 0..7u64 {
                let s = src.read(id).unwrap();
                assert_eq!((s.index, s.key.as_str()), (id, format!("k{id}").as_str()));
                let Some(Field::Bytes(jpg)) = s.get("jpg") else {
                    panic!()
                };
                assert_eq!(jpg.len(), 100 * id as usize);
            }
            assert!(matches!(src.read(7), Err(Error::Config(_))));
            manifests.push(src.manifest().clone());
        }
        assert!(manifests.windows(2).all(|w| w[0] == w[1]));
        // The writer's shard list is the manifest.
        assert_eq!(Manifest::new(FORMAT, shards.clone()), manifests[0]);

        // Require without index files is an error naming the index; Auto scans.
        for s in &shards {
            std::fs::remove_file(index_path(Path::new(&s.path))).unwrap();
        }
        let e = WebDatasetSource::open(
            &paths,
            WebDatasetOptions {
                index: IndexMode::Require,
                ..WebDatasetOptions::default()
            },
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("s-0000.tar.idx") && e.to_string().contains("chute index"),
            "{e}"
        );
        let src = WebDatasetSource::open(&paths, WebDatasetOptions::default()).unwrap();
        assert_eq!(src.manifest(), &manifests[0]);

        // A stale index (from another shard) is caught at open or on read.
        let other = ShardIndex::scan(
            &std::fs::read(&paths[0]).unwrap(),
            "x",
            TarOptions::default(),
        )
        .unwrap();
        other.save(&index_path(Path::new(&paths[2]))).unwrap();
        let e = WebDatasetSource::open(&paths, WebDatasetOptions::default()).unwrap_err();
        assert!(e.to_string().contains("stale"), "{e}");
        let bad = "chute-wds-index 1\n0 1024\n1024 nope\n";
        std::fs::write(index_path(Path::new(&paths[2])), bad).unwrap();
        let e = WebDatasetSource::open(&paths, WebDatasetOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("s-0002.tar.idx") && e.to_string().contains("line 3"),
            "{e}"
        );
        assert!(
            WebDatasetSource::open(
                &paths,
                WebDatasetOptions {
                    index: IndexMode::Scan,
                    ..Default::default()
                }
            )
            .is_ok()
        );
        let none: &[&Path] = &[];
        assert!(matches!(
            WebDatasetSource::open(none, WebDatasetOptions::default()),
            Err(Error::Config(_))
        ));
    }

    /// Golden shards made by other tools (testdata/webdataset/README.md says how).
    mod golden {
        use super::*;

        fn testdata(name: &str) -> PathBuf {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/webdataset")
                .join(name)
        }

        fn open(name: &str) -> WebDatasetSource {
            WebDatasetSource::open(
                &[testdata(name)],
                WebDatasetOptions {
                    index: IndexMode::Scan,
                    ..WebDatasetOptions::default()
                },
            )
            .unwrap()
        }

        fn all(src: &WebDatasetSource) -> Vec<Plain> {
            (0..src.manifest().total_samples())
                .map(|i| plain(&src.read(i).unwrap()))
                .collect()
        }

        fn fields(f: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
            f.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect()
        }

        #[test]
        fn webdataset_tarwriter_shard() {
            let src = open("wds-tarwriter.tar");
            let got = all(&src);
            let jpg = |i: u8| -> Vec<u8> { [&[0xff, 0xd8, 0xff, 0xe0][..], &[i; 10][..]].concat() };
            let want = vec![
                (
                    "sample000".to_string(),
                    fields(&[
                        ("cls", b"0"),
                        ("jpg", &jpg(0)),
                        ("json", br#"{"i": 0, "caption": "image 0"}"#),
                    ]),
                ),
                (
                    "sample001".to_string(),
                    fields(&[
                        ("cls", b"1"),
                        ("jpg", &jpg(1)),
                        ("json", br#"{"i": 1, "caption": "image 1"}"#),
                    ]),
                ),
                (
                    "sample002".to_string(),
                    fields(&[
                        ("cls", b"2"),
                        ("jpg", &jpg(2)),
                        ("json", br#"{"i": 2, "caption": "image 2"}"#),
                    ]),
                ),
                (
                    "train.v1/shard.a/sample003".to_string(),
                    fields(&[
                        ("cls", b"3"),
                        ("jpg", &jpg(3)),
                        ("seg.png", b"\x89PNG fake"),
                    ]),
                ),
            ];
            assert_eq!(got, want);
            let seq: Vec<_> = Samples::new(
                Bytes::from(std::fs::read(testdata("wds-tarwriter.tar")).unwrap()),
                "golden",
                TarOptions::default(),
            )
            .map(|s| plain(&s.unwrap()))
            .collect();
            assert_eq!(seq, want);
        }

        #[test]
        fn webdataset_shardwriter_shards() {
            let src = WebDatasetSource::open(
                &[
                    testdata("wds-shard-000000.tar"),
                    testdata("wds-shard-000001.tar"),
                ],
                WebDatasetOptions::default(),
            )
            .unwrap();
            let got = all(&src);
            assert_eq!(
                src.manifest()
                    .shards
                    .iter()
                    .map(|s| s.samples)
                    .collect::<Vec<_>>(),
                [3, 2]
            );
            let keys: Vec<_> = got.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["s0", "s1", "s2", "s3", "s4"]);
            for (i, (_, f)) in got.iter().enumerate() {
                assert_eq!(
                    f,
                    &fields(&[
                        ("cls", i.to_string().as_bytes()),
                        ("txt", format!("text {i}").as_bytes())
                    ])
                );
            }
        }

        #[test]
        fn gnu_tar_long_names() {
            let got = all(&open("gnu-longname.tar"));
            let dir = "a.very.long.directory.name.with.dots/".repeat(3);
            assert_eq!(
                got,
                vec![
                    (
                        format!("{dir}sample_with_a_rather_long_key_0001"),
                        fields(&[("cls", b"1\n"), ("txt", b"hello\n")])
                    ),
                    ("short".to_string(), fields(&[("txt", b"short\n")])),
                ]
            );
        }

        #[test]
        fn gnu_tar_ustar_prefix() {
            let got = all(&open("ustar.tar"));
            let dir = "a.very.long.directory.name.with.dots/".repeat(3);
            assert_eq!(
                got,
                vec![
                    (
                        format!("{dir}sample_with_a_rather_long_key_0001"),
                        fields(&[("cls", b"1\n"), ("txt", b"hello\n")])
                    ),
                    ("short".to_string(), fields(&[("txt", b"short\n")])),
                ]
            );
        }

        #[test]
        fn gnu_tar_pax_format() {
            let got = all(&open("pax.tar"));
            let dir = "a.very.long.directory.name.with.dots/".repeat(3);
            assert_eq!(
                got,
                vec![
                    (
                        format!("{dir}sample_with_a_rather_long_key_0001"),
                        fields(&[("cls", b"1\n"), ("txt", b"hello\n")])
                    ),
                    ("short".to_string(), fields(&[("txt", b"short\n")])),
                    (
                        "\u{e9}t\u{e9}".to_string(),
                        fields(&[("txt", b"unicode\n")])
                    ),
                ]
            );
        }
    }
}
