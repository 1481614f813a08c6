//! Lying headers and decompression bombs, one per decoder, read end to end (`chute::open`,
//! the loader) in a child process whose address space is capped at 2 GB: an allocation sized
//! from a header alone would abort the child (and fail the test) instead of being refused.
//! Each must be a clear error, or with `on_error = skip` a skipped sample, naming what lied.

use std::path::Path;
use std::sync::Arc;

use chute::core::{OnError, Source};
use chute::formats::tfrecord::masked_crc32c;
use chute::{Format, Loader, OpenOptions};

const INNER: &str = "CHUTE_BOMBS_UNDER_LIMIT";

#[test]
fn hostile_sizes_are_refused_under_a_memory_limit() {
    if std::env::var_os(INNER).is_some() {
        bombs_in(tempfile::tempdir().unwrap().path());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            "ulimit -v 2000000 && exec \"$0\" --exact --test-threads 1 \
             bombs::hostile_sizes_are_refused_under_a_memory_limit",
        )
        .arg(&exe)
        .env(INNER, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "under a 2 GB limit:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Opens `path` and reads every sample: an error at open or at each read is fine, a sample
/// delivered is not (every file here lies), and nothing may abort.
fn refused(path: &Path, format: Format, what: &str, expect: &str) {
    let options = OpenOptions {
        format: Some(format),
        verify_checksums: false,
        ..OpenOptions::default()
    };
    let err = match chute::open(&[path], &options) {
        Err(e) => e.to_string(),
        Ok(src) => {
            let n = src.manifest().total_samples();
            let errors: Vec<String> = (0..n.min(8))
                .map(|id| src.read(id).expect_err(what).to_string())
                .collect();
            assert!(
                !errors.is_empty(),
                "{what}: opened with no sample and no error"
            );
            errors.join("; ")
        }
    };
    assert!(err.contains(expect), "{what}: {err}");
}

fn bombs_in(dir: &Path) {
    // Tar: a member whose header claims 8 GiB - 1 bytes, in a file of 512.
    let mut h = [0u8; 512];
    h[..8].copy_from_slice(b"bomb.jpg");
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(b"77777777777");
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let tar = dir.join("bomb.tar");
    std::fs::write(&tar, h).unwrap();
    refused(&tar, Format::WebDataset, "tar", "bomb.jpg");

    // TFRecord: a record length of 2^60 (with its length CRC right) in a file of 16 bytes.
    let len = (1u64 << 60).to_le_bytes();
    let mut rec = len.to_vec();
    rec.extend(masked_crc32c(&len).to_le_bytes());
    rec.extend([0u8; 4]);
    let tfr = dir.join("bomb.tfrecord");
    std::fs::write(&tfr, &rec).unwrap();
    refused(&tfr, Format::TfRecord, "tfrecord", "bomb.tfrecord");

    // tf.train.Example: a bytes feature whose length prefix claims 2^40 bytes.
    let mut example = vec![0x0A]; // Example.features
    let mut features = vec![0x0A]; // Features.feature (map entry)
    let mut entry = vec![0x0A, 0x01, b'x', 0x12]; // key "x", value Feature
    let feature = [0x0A, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20]; // bytes_list, length 2^40
    entry.push(feature.len() as u8);
    entry.extend(feature);
    features.push(entry.len() as u8);
    features.extend(entry);
    example.push(features.len() as u8);
    example.extend(features);
    let ex = dir.join("example.tfrecord");
    std::fs::write(&ex, framed(&example)).unwrap();
    refused(&ex, Format::TfRecord, "Example", "example.tfrecord");

    // Parquet: a footer whose length claims 2 GiB.
    let mut pq = b"PAR1".to_vec();
    pq.extend([0u8; 64]);
    pq.extend(0x7FFF_FFF0u32.to_le_bytes());
    pq.extend(b"PAR1");
    let pqf = dir.join("bomb.parquet");
    std::fs::write(&pqf, &pq).unwrap();
    refused(&pqf, Format::Parquet, "parquet", "bomb.parquet");

    // Parquet, hand-written so every size is the test's: a valid file first (so the bombs
    // below are refused for what they declare, not for being unreadable), then a page whose
    // header declares 2^31 - 1 bytes uncompressed (arrow-rs reserves that much before
    // decompressing), a row group declaring 2^40 rows in 6 bytes (arrow-rs reserves a batch
    // of them per column; chute would cut them into 2^26 shards), one declaring 300 Mi rows
    // of int32 in 1.3 MB (bytes that could hold them RLE-encoded, 1.2 GB decoded) and 65 row
    // groups of 2^28 rows each (1 GiB decoded each, within the limit, but 2^20 shards in all
    // from a file of a few hundred bytes).
    let good = dir.join("good.parquet");
    std::fs::write(&good, parquet_file(4, 1, 0)).unwrap();
    let src = chute::open(&[&good], &OpenOptions::default()).unwrap();
    assert_eq!(src.manifest().total_samples(), 1);
    src.read(0).expect("the hand-written Parquet file reads");
    let page = dir.join("page-bomb.parquet");
    std::fs::write(&page, parquet_file(i32::MAX, 1, 0)).unwrap();
    refused(&page, Format::Parquet, "parquet page", "max_decoded_bytes");
    let rows = dir.join("rows-bomb.parquet");
    std::fs::write(&rows, parquet_file(4, 1 << 40, 0)).unwrap();
    refused(&rows, Format::Parquet, "parquet rows", "max_decoded_bytes");
    let groups = dir.join("groups-bomb.parquet");
    std::fs::write(&groups, parquet_groups(1 << 28, 65)).unwrap();
    refused(
        &groups,
        Format::Parquet,
        "parquet row groups",
        "shards of rows",
    );
    let wide = dir.join("wide-bomb.parquet");
    std::fs::write(&wide, parquet_file(4, 300 << 20, 1300 << 10)).unwrap();
    refused(&wide, Format::Parquet, "parquet rows", "max_decoded_bytes");
    // A file arrow-rs wrote whose embedded Arrow schema says each row is a list of 2^22
    // floats, every row null: arrow-rs fills a null row of a fixed-size list with its size
    // in values, 4 GiB here (found by the parquet_file fuzz target).
    let lists = dir.join("fixed-list-bomb.parquet");
    std::fs::write(&lists, fixed_list_bomb()).unwrap();
    refused(
        &lists,
        Format::Parquet,
        "parquet fixed-size lists",
        "max_decoded_bytes",
    );

    // Arrow IPC, zstd-compressed: a buffer whose uncompressed length is rewritten to 2 GiB
    // (within what zstd could expand its 400 KB to, so only the limit stops it).
    let ipc = dir.join("bomb.arrow");
    std::fs::write(&ipc, ipc_bomb()).unwrap();
    refused(&ipc, Format::Arrow, "arrow", "max_decoded_bytes");

    // tf.train.Example: more features than max_features (each an empty map entry).
    let mut features = Vec::new();
    for _ in 0..100_001 {
        features.extend([0x0A, 0x05, 0x0A, 0x01, b'a', 0x12, 0x00]);
    }
    let mut example = vec![0x0A];
    varint(&mut example, features.len() as u64);
    example.extend(features);
    let many = dir.join("features.tfrecord");
    std::fs::write(&many, framed(&example)).unwrap();
    refused(&many, Format::TfRecord, "Example features", "max_features");

    // .npy token ids: a header declaring 10^11 x 4 int64 (3.2 TB) over 16 bytes of data.
    let mut header =
        "{'descr': '<i8', 'fortran_order': False, 'shape': (100000000000, 4), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend((header.len() as u16).to_le_bytes());
    npy.extend(header.as_bytes());
    npy.extend([0u8; 16]);
    let e = chute::dataset::token_ids_from_npy(&npy, "bomb.npy").unwrap_err();
    assert!(e.to_string().contains("bomb.npy"), "npy: {e}");

    // Images: a PNG declaring 60,000 x 60,000 and a JPEG declaring 65,500 x 65,500 among good
    // samples, decoded by the loader with on_error = skip: skipped, named, the rest delivered.
    let good = crate::conformance::jpeg(0);
    let mut jpeg_bomb = good.clone();
    let sof = jpeg_bomb
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .unwrap();
    jpeg_bomb[sof + 5..sof + 7].copy_from_slice(&65_500u16.to_be_bytes());
    jpeg_bomb[sof + 7..sof + 9].copy_from_slice(&65_500u16.to_be_bytes());
    let shard = dir.join("images.tar");
    let mut w = chute::formats::webdataset::SampleWriter::new(
        std::fs::File::create(&shard).unwrap(),
        "images.tar",
    );
    w.write("a", &[("img", &good)]).unwrap();
    w.write("b", &[("img", &chute::ops::testing::png_bomb())])
        .unwrap();
    w.write("c", &[("img", &good)]).unwrap();
    w.write("d", &[("img", &jpeg_bomb)]).unwrap();
    w.finish().unwrap();
    let src: Arc<dyn Source> = chute::open(&[&shard], &OpenOptions::default()).unwrap();
    let ops = chute::ops::SampleOps::from_json(
        r#"{"img": [{"op": "decode"}, {"op": "center_crop", "size": 8}]}"#,
    )
    .unwrap();
    let mut loader = Loader::builder_arc(src)
        .batch_size(2)
        .on_error(OnError::Skip)
        .transform(ops)
        .build()
        .unwrap();
    let delivered: usize = (&mut loader).map(|b| b.unwrap().len()).sum();
    assert_eq!(delivered, 4, "skipped samples are replaced");
    let stats = loader.stats();
    assert_eq!(stats.skipped, 2);
    let why = stats.skipped_recent.join("\n");
    assert!(
        why.contains("60000 x 60000") && why.contains("65500 x 65500"),
        "{why}"
    );
    assert!(why.contains("max_image_pixels"), "{why}");
}

/// A Parquet file of one required int32 column `x` and one row group of `rows` rows, whose
/// one data page (snappy, 4 bytes of zeros) declares `uncompressed` bytes uncompressed,
/// followed by `pad` zero bytes inside the column chunk: Parquet's Thrift compact encoding,
/// written by hand.
fn parquet_file(uncompressed: i32, rows: i64, pad: usize) -> Vec<u8> {
    parquet_with(uncompressed, rows, pad, 1)
}

/// A file as [`parquet_file`]'s with `groups` row groups of `rows` rows, all pointing at the
/// one column chunk.
fn parquet_groups(rows: i64, groups: u8) -> Vec<u8> {
    parquet_with(4, rows, 0, groups)
}

fn parquet_with(uncompressed: i32, rows: i64, pad: usize, groups: u8) -> Vec<u8> {
    let snappy = [0x04, 0x0C, 0, 0, 0, 0]; // length 4, a literal of 4 bytes
    let mut page = Thrift::default();
    page.i32(1, 0); // DATA_PAGE
    page.i32(2, uncompressed);
    page.i32(3, snappy.len() as i32);
    page.begin(5); // DataPageHeader
    page.i32(1, 1); // num_values
    page.i32(2, 0); // PLAIN
    page.i32(3, 3); // RLE
    page.i32(4, 3);
    page.end();
    page.end();
    let mut file = b"PAR1".to_vec();
    file.extend(&page.out);
    file.extend(snappy);
    file.resize(file.len() + pad, 0);
    let chunk_len = (page.out.len() + snappy.len() + pad) as i64;
    let mut meta = Thrift::default();
    meta.i32(1, 1); // version
    meta.list(2, 12, 2); // schema
    meta.element();
    meta.binary(4, b"schema");
    meta.i32(5, 1); // num_children
    meta.end();
    meta.element();
    meta.i32(1, 1); // INT32
    meta.i32(3, 0); // REQUIRED
    meta.binary(4, b"x");
    meta.end();
    meta.i64(3, rows * i64::from(groups));
    meta.field(4, 9); // row_groups
    if groups < 15 {
        meta.out.push((groups << 4) | 12);
    } else {
        meta.out.push(0xF0 | 12);
        varint(&mut meta.out, u64::from(groups));
    }
    for _ in 0..groups {
        row_group(&mut meta, rows, chunk_len);
    }
    meta.end(); // FileMetaData
    file.extend(&meta.out);
    file.extend((meta.out.len() as u32).to_le_bytes());
    file.extend(b"PAR1");
    file
}

/// A RowGroup of one int32 column chunk of `rows` rows, its page at offset 4.
fn row_group(meta: &mut Thrift, rows: i64, chunk_len: i64) {
    meta.element();
    meta.list(1, 12, 1); // columns
    meta.element();
    meta.i64(2, 4); // file_offset
    meta.begin(3); // ColumnMetaData
    meta.i32(1, 1); // INT32
    meta.list(2, 5, 1);
    meta.out.push(0); // [PLAIN]
    meta.list(3, 8, 1);
    meta.out.extend([1, b'x']); // path ["x"]
    meta.i32(4, 1); // SNAPPY
    meta.i64(5, rows);
    meta.i64(6, chunk_len);
    meta.i64(7, chunk_len);
    meta.i64(9, 4); // data_page_offset
    meta.end();
    meta.end(); // ColumnChunk
    meta.i64(2, chunk_len); // total_byte_size
    meta.i64(3, rows);
    meta.end(); // RowGroup
}

/// Thrift's compact protocol, as much as [`parquet_file`] needs.
#[derive(Default)]
struct Thrift {
    out: Vec<u8>,
    last: Vec<i16>,
    id: i16,
}

impl Thrift {
    fn field(&mut self, id: i16, ty: u8) {
        let delta = id - self.id;
        assert!((1..=15).contains(&delta));
        self.out.push(((delta as u8) << 4) | ty);
        self.id = id;
    }
    fn zigzag(&mut self, v: i64) {
        varint(&mut self.out, ((v << 1) ^ (v >> 63)) as u64);
    }
    fn i32(&mut self, id: i16, v: i32) {
        self.field(id, 5);
        self.zigzag(i64::from(v));
    }
    fn i64(&mut self, id: i16, v: i64) {
        self.field(id, 6);
        self.zigzag(v);
    }
    fn binary(&mut self, id: i16, b: &[u8]) {
        self.field(id, 8);
        varint(&mut self.out, b.len() as u64);
        self.out.extend(b);
    }
    fn list(&mut self, id: i16, elem: u8, n: u8) {
        self.field(id, 9);
        self.out.push((n << 4) | elem);
    }
    /// A struct field `id`; fields follow until [`Thrift::end`].
    fn begin(&mut self, id: i16) {
        self.field(id, 12);
        self.element();
    }
    /// A struct as a list element.
    fn element(&mut self) {
        self.last.push(self.id);
        self.id = 0;
    }
    fn end(&mut self) {
        self.out.push(0);
        self.id = self.last.pop().unwrap_or(0);
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An Arrow IPC file (zstd) of 400,000 pseudo-random int64s below 256 (compressible, so
/// arrow-rs keeps them compressed: about 400 KB) whose data buffer's uncompressed-length
/// prefix is rewritten to 2 GiB.
fn ipc_bomb() -> Vec<u8> {
    use arrow_array::{Int64Array, RecordBatch};
    use arrow_ipc::writer::{FileWriter, IpcWriteOptions};
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let values: Vec<i64> = (0..400_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x & 0xFF) as i64
        })
        .collect();
    let batch = RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int64Array::from(values)) as arrow_array::ArrayRef,
    )])
    .unwrap();
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(arrow_ipc::CompressionType::ZSTD))
        .unwrap();
    let mut out = Vec::new();
    let mut w = FileWriter::try_new_with_options(&mut out, &batch.schema(), options).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    drop(w);
    let prefix = (400_000u64 * 8).to_le_bytes();
    let at: Vec<usize> = (0..out.len() - 8)
        .filter(|&i| out[i..i + 8] == prefix)
        .collect();
    assert_eq!(at.len(), 1, "one buffer of 3,200,000 bytes");
    out[at[0]..at[0] + 8].copy_from_slice(&(1u64 << 31).to_le_bytes());
    out
}

/// A Parquet file of 256 null rows of a fixed-size list of float32 (written by arrow-rs with
/// lists of 2,766 floats, a size whose bytes occur once in the schema), whose embedded Arrow
/// schema (`ARROW:schema`, base64) is edited to say lists of 2^22 floats.
fn fixed_list_bomb() -> Vec<u8> {
    use arrow_array::RecordBatch;
    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    const K: i32 = 2766;
    let mut lists = FixedSizeListBuilder::new(Float32Builder::new(), K);
    for _ in 0..256 {
        lists.values().append_nulls(K as usize);
        lists.append(false);
    }
    let batch =
        RecordBatch::try_from_iter([("x", Arc::new(lists.finish()) as arrow_array::ArrayRef)])
            .unwrap();
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&bytes::Bytes::from(out.clone()))
        .unwrap();
    let schema = meta
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == "ARROW:schema"))
        .and_then(|kv| kv.value.clone())
        .expect("arrow-rs embeds the Arrow schema");
    let mut ipc = from_base64(schema.as_bytes());
    let size: Vec<usize> = (0..ipc.len() - 4)
        .filter(|&i| ipc[i..i + 4] == K.to_le_bytes())
        .collect();
    assert_eq!(size.len(), 1, "the list size occurs once in the schema");
    ipc[size[0]..size[0] + 4].copy_from_slice(&(1i32 << 22).to_le_bytes());
    let edited = to_base64(&ipc);
    let at: Vec<usize> = (0..out.len() - schema.len())
        .filter(|&i| out[i..i + schema.len()] == *schema.as_bytes())
        .collect();
    assert_eq!(at.len(), 1);
    assert_eq!(edited.len(), schema.len());
    out[at[0]..at[0] + schema.len()].copy_from_slice(&edited);
    out
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (with padding) decoded.
fn from_base64(text: &[u8]) -> Vec<u8> {
    let (mut out, mut n, mut bits) = (Vec::new(), 0u32, 0);
    for &c in text.iter().take_while(|&&c| c != b'=') {
        let v = BASE64.iter().position(|&a| a == c).expect("base64") as u32;
        n = (n << 6 | v) & 0xFF_FFFF;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
        }
    }
    out
}

/// `data` in standard base64 (with padding).
fn to_base64(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in data.chunks(3) {
        let b = |i: usize| u32::from(*chunk.get(i).unwrap_or(&0));
        let n = b(0) << 16 | b(1) << 8 | b(2);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                BASE64[(n >> (18 - 6 * i) & 63) as usize]
            } else {
                b'='
            });
        }
    }
    out
}

/// `record` as one TFRecord record (lengths and CRCs right).
fn framed(record: &[u8]) -> Vec<u8> {
    let mut out = (record.len() as u64).to_le_bytes().to_vec();
    out.extend(masked_crc32c(&out[..8]).to_le_bytes());
    out.extend(record);
    out.extend(masked_crc32c(record).to_le_bytes());
    out
}
