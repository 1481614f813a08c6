//! `chute demo`: the README's main job on a built-in synthetic dataset: an ImageNet-like set
//! of JPEGs in WebDataset shards (or, with `--tokens`, a token corpus; with `--audio`, a
//! speech-like set of WAV clips turned into Whisper features).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use chute::core::{DType, OnError, SampleRng, Shuffle};
use chute::formats::webdataset::{ShardWriter, ShardWriterOptions, WebDatasetOptions};
use chute::formats::{TokenOptions, TokenSource, TokenWriter, WebDatasetSource};
use chute::ops::SampleOps;
use chute::pipeline::for_each_parallel;
use clap::Args;

use crate::bench::{LoaderArgs, RunArgs, Summary, human_bytes, print_summary, run_loop};

/// `chute demo` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoArgs {
    /// Train on a synthetic token corpus (nanoGPT's `.bin`) instead of images.
    #[arg(long)]
    tokens: bool,
    /// Train on synthetic audio clips (1 to 12 s of 44.1 kHz 16-bit WAV, 10 classes): decoded,
    /// resampled to 16 kHz mono and turned into Whisper's log-mel features.
    #[arg(long, conflicts_with = "tokens")]
    audio: bool,
    /// `--audio`: clips in the synthetic set.
    #[arg(long, default_value_t = 512)]
    clips: usize,
    /// Train on synthetic videos (H.264 in MP4, 320x240 at 25 fps, 2 to 4 s, 10 classes):
    /// 16-frame clips sampled at random, resized and randomly cropped to 112 (needs the cargo
    /// feature `video`: `cargo run --release --features video -- demo --video`).
    #[arg(long, conflicts_with_all = ["tokens", "audio"])]
    video: bool,
    /// `--video`: videos in the synthetic set.
    #[arg(long, default_value_t = 64)]
    videos: usize,
    /// Images in the synthetic set (256x256 JPEGs, 10 classes).
    #[arg(long, default_value_t = 2048)]
    images: usize,
    /// `--tokens`: tokens in the synthetic corpus.
    #[arg(long, default_value_t = 16 << 20)]
    num_tokens: u64,
    /// `--tokens`: tokens per training sequence.
    #[arg(long, default_value_t = 1024)]
    seq_len: usize,
    /// Samples per batch (default 64 images, or 16 token sequences).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Epochs to train.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Simulated training step per batch, in milliseconds.
    #[arg(long, default_value_t = 3.0)]
    step_ms: f64,
    /// Worker threads; default: one per core.
    #[arg(long)]
    workers: Option<usize>,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the JSON summary instead of text.
    #[arg(long)]
    json: bool,
    /// Write the synthetic image shards into DIR and keep them (to bench them again, say
    /// from a web server), instead of a temporary folder.
    #[arg(long, value_name = "DIR")]
    keep: Option<std::path::PathBuf>,
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.tokens {
        return run_tokens(args);
    }
    if args.video {
        return run_video(args);
    }
    if args.audio {
        return run_audio(args);
    }
    let (_tmp, dir) = shard_dir(&args)?;
    let t = Instant::now();
    let shards = write_images(&dir, args.images, args.seed)?;
    let bytes: u64 = shards
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    if !args.json {
        println!(
            "chute demo: drew {} synthetic 256x256 JPEGs of 10 classes ({}) in {:.2} s, as {} \
             WebDataset shards in {}",
            args.images,
            human_bytes(bytes as f64),
            t.elapsed().as_secs_f64(),
            shards.len(),
            dir.display()
        );
    }
    let source = WebDatasetSource::open(&shards, WebDatasetOptions::default())?;
    let batch_size = args.batch_size.unwrap_or(64);
    let transform = SampleOps::from_json(IMAGE_OPS)?;
    let mut loader = loader_args(&args, batch_size, Some(transform)).build(Arc::new(source))?;
    if !args.json {
        println!(
            "training: {} images; decode + RandomResizedCrop(224) + horizontal flip on {} \
             workers; batches of {batch_size} as uint8 [{batch_size}, 224, 224, 3] with int64 \
             labels; global shuffle, {} epochs, {} ms simulated step",
            loader.source().manifest().total_samples(),
            loader.options().num_workers,
            args.epochs,
            args.step_ms
        );
    }
    let summary = train(&mut loader, &args)?;
    if !args.json {
        println!(
            "images: {:.0} images/s; the training step waited for images {:.1}% of the time",
            summary.samples_per_sec,
            summary.wait_fraction * 100.0
        );
    }
    Ok(())
}

/// Where the synthetic shards go: `--keep`'s folder, or a temporary one (removed when the
/// first value is dropped).
fn shard_dir(args: &DemoArgs) -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf)> {
    let tmp = tempfile::Builder::new().prefix("chute-demo-").tempdir()?;
    let dir = match &args.keep {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    Ok((tmp, dir))
}

/// The demo's ops: what an ImageNet training script does to each sample (normalising is
/// left to the GPU, as DALI users do: a uint8 batch is a quarter of the bytes to copy).
const IMAGE_OPS: &str = r#"{
    "jpg": {"as": "image", "ops": [
        {"op": "decode"},
        {"op": "random_resized_crop", "size": 224},
        {"op": "horizontal_flip"}
    ]},
    "cls": [{"op": "label"}]
}"#;

/// The demo's loader: global shuffle, full batches, the user's workers and seed.
fn loader_args(args: &DemoArgs, batch_size: usize, transform: Option<SampleOps>) -> LoaderArgs {
    LoaderArgs {
        batch_size,
        workers: args.workers,
        prefetch: 2,
        shuffle: Some(Shuffle::Global),
        seed: args.seed,
        epoch: 0,
        rank: 0,
        world_size: 1,
        drop_last: true,
        on_error: OnError::Raise,
        pin_memory: false,
        transform,
        pad: false,
    }
}

fn train(loader: &mut chute::Loader, args: &DemoArgs) -> anyhow::Result<Summary> {
    let run = RunArgs {
        epochs: args.epochs,
        step_ms: args.step_ms,
        json: args.json,
        digest: true,
        ids: None,
        save_state_at: None,
        resume: None,
        quiet: false,
        metrics_port: None,
        metrics_address: std::net::Ipv4Addr::LOCALHOST.into(),
        metrics_hold: 0.0,
        plot: None,
    };
    let summary = run_loop(loader, &run)?;
    print_summary(&summary, &run);
    Ok(summary)
}

/// Draws `n` JPEGs (shapes and gradients whose colours and layout depend on the class) and
/// writes them with their labels as WebDataset shards of 256 samples, in parallel.
fn write_images(dir: &Path, n: usize, seed: u64) -> anyhow::Result<Vec<std::path::PathBuf>> {
    const PER_SHARD: usize = 256;
    let shards = n.div_ceil(PER_SHARD);
    let pattern = dir.join("train-%06d.tar").display().to_string();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    for_each_parallel(shards, workers, |k| -> anyhow::Result<()> {
        let mut w = ShardWriter::new(
            &pattern,
            ShardWriterOptions {
                start_shard: k as u64,
                max_count: PER_SHARD as u64,
                ..Default::default()
            },
        )?;
        for i in k * PER_SHARD..((k + 1) * PER_SHARD).min(n) {
            let mut rng = SampleRng::for_sample(seed, u64::MAX, i as u64);
            let class = rng.below(10) as usize;
            let jpg = draw(class, &mut rng)?;
            w.write(
                &format!("img{i:07}"),
                &[("cls", class.to_string().as_bytes()), ("jpg", &jpg)],
            )?;
        }
        w.finish()?;
        Ok(())
    })?;
    Ok((0..shards)
        .map(|k| dir.join(format!("train-{k:06}.tar")))
        .collect())
}

/// A 256x256 picture: a background gradient, a disc and a bar placed at random, coloured by
/// the class, with some noise; JPEG quality 90.
fn draw(class: usize, rng: &mut SampleRng) -> anyhow::Result<Vec<u8>> {
    const S: usize = 256;
    let hue = |c: usize, k: usize| ((c * 73 + k * 91) % 256) as f32;
    let (cx, cy) = (
        rng.uniform(48.0, 208.0) as f32,
        rng.uniform(48.0, 208.0) as f32,
    );
    let r = rng.uniform(20.0, 70.0) as f32;
    let bar = rng.below(S as u64 - 40) as usize;
    let mut px = vec![0u8; S * S * 3];
    for y in 0..S {
        for x in 0..S {
            let (fx, fy) = (x as f32, y as f32);
            let inside = (fx - cx).powi(2) + (fy - cy).powi(2) < r * r;
            let on_bar = (bar..bar + 24).contains(&x) && class.is_multiple_of(2)
                || (bar..bar + 24).contains(&y) && class % 2 == 1;
            let noise = (rng.next_u64() % 24) as f32;
            for k in 0..3 {
                let base = if inside {
                    hue(class, k)
                } else if on_bar {
                    255.0 - hue(class, k + 1)
                } else {
                    (fx * (k as f32 + 1.0) + fy * (3.0 - k as f32)) / 4.0 % 256.0
                };
                px[(y * S + x) * 3 + k] = (base * 0.9 + noise).min(255.0) as u8;
            }
        }
    }
    let mut out = Vec::with_capacity(S * S);
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&px, S as u16, S as u16, jpeg_encoder::ColorType::Rgb)
        .context("encoding a demo JPEG")?;
    Ok(out)
}

fn run_tokens(args: DemoArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("chute-demo-").tempdir()?;
    let path = dir.path().join("train.bin");
    let t = Instant::now();
    write_corpus(&path, args.num_tokens, args.seed)?;
    let bytes = std::fs::metadata(&path)?.len();
    if !args.json {
        println!(
            "chute demo: wrote a synthetic corpus of {} uint16 tokens ({}) in {:.2} s to {}",
            args.num_tokens,
            human_bytes(bytes as f64),
            t.elapsed().as_secs_f64(),
            path.display()
        );
    }
    let source = TokenSource::open(
        &[&path],
        TokenOptions {
            seq_len: args.seq_len,
            dtype: DType::U16,
            out_dtype: DType::I64,
        },
    )?;
    let batch_size = args.batch_size.unwrap_or(16);
    let mut loader = loader_args(&args, batch_size, None).build(Arc::new(source))?;
    if !args.json {
        println!(
            "training: {} sequences of {} tokens, batches of {} as int64 [{}, {}], global \
             shuffle, {} workers, {} epochs, {} ms simulated step",
            loader.source().manifest().total_samples(),
            args.seq_len,
            batch_size,
            batch_size,
            args.seq_len + 1,
            loader.options().num_workers,
            args.epochs,
            args.step_ms
        );
    }
    train(&mut loader, &args).map(drop)
}

/// Writes `n` pseudo-random tokens with a Zipf-like spread over a GPT-2-sized vocabulary.
fn write_corpus(path: &std::path::Path, n: u64, seed: u64) -> anyhow::Result<()> {
    let mut w = TokenWriter::create(path, DType::U16)
        .with_context(|| format!("creating {}", path.display()))?;
    let mut rng = SampleRng::from_key(seed);
    let mut chunk = Vec::with_capacity(1 << 16);
    let mut left = n;
    while left > 0 {
        chunk.clear();
        let k = left.min(1 << 16);
        for _ in 0..k {
            // Squaring a uniform draw skews ids towards small values, as real text does.
            let u = rng.next_f64();
            chunk.push((u * u * 50_257.0) as u32);
        }
        w.write_tokens(&chunk)?;
        left -= k;
    }
    w.finish()?;
    Ok(())
}

/// The video demo's ops: what a video classifier's loader does to each video.
#[cfg(feature = "video")]
const VIDEO_OPS: &str = r#"{
    "mp4": {"as": "video", "ops": [
        {"op": "decode_video", "frames": 16, "stride": 2, "resize": 128, "crop": 112,
         "crop_mode": "random"}
    ]},
    "cls": [{"op": "label"}]
}"#;

#[cfg(not(feature = "video"))]
fn run_video(_: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "this chute was built without video: build it with the cargo feature `video` (it links \
         the system's FFmpeg libraries; Debian: apt-get install libavcodec-dev libavformat-dev \
         libswscale-dev libclang-dev): cargo run --release --features video -- demo --video"
    )
}

#[cfg(feature = "video")]
fn run_video(args: DemoArgs) -> anyhow::Result<()> {
    let (_tmp, dir) = shard_dir(&args)?;
    let t = Instant::now();
    let (shards, frames) = write_videos(&dir, args.videos, args.seed)?;
    if !args.json {
        println!(
            "chute demo: encoded {} synthetic videos of 10 classes ({frames} frames of 320x240 \
             at 25 fps, H.264 or MPEG-4 in MP4) in {:.2} s, as {} WebDataset shards in {}",
            args.videos,
            t.elapsed().as_secs_f64(),
            shards.len(),
            dir.display()
        );
    }
    let source = WebDatasetSource::open(&shards, WebDatasetOptions::default())?;
    let batch_size = args.batch_size.unwrap_or(8);
    let transform = SampleOps::from_json(VIDEO_OPS)?;
    let mut loader = loader_args(&args, batch_size, Some(transform)).build(Arc::new(source))?;
    if !args.json {
        println!(
            "training: {} videos; a random 16-frame clip (every 2nd frame) decoded, resized to \
             128 and randomly cropped to 112 on {} workers; batches of {batch_size} as uint8 \
             [{batch_size}, 16, 112, 112, 3] with their frames' times and int64 labels; global \
             shuffle, {} epochs, {} ms simulated step",
            loader.source().manifest().total_samples(),
            loader.options().num_workers,
            args.epochs,
            args.step_ms
        );
    }
    let summary = train(&mut loader, &args)?;
    if !args.json {
        println!(
            "video: {:.0} clips/s ({:.0} frames delivered per second); the training step waited \
             {:.1}% of the time",
            summary.samples_per_sec,
            summary.samples_per_sec * 16.0,
            summary.wait_fraction * 100.0
        );
    }
    Ok(())
}

/// Writes `n` synthetic videos (2 to 4 s each) with their labels as WebDataset shards of 32,
/// in parallel; gives the shards and the frames encoded.
#[cfg(feature = "video")]
fn write_videos(dir: &Path, n: usize, seed: u64) -> anyhow::Result<(Vec<std::path::PathBuf>, u64)> {
    const PER_SHARD: usize = 32;
    let shards = n.div_ceil(PER_SHARD);
    let pattern = dir.join("video-%06d.tar").display().to_string();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let frames = std::sync::atomic::AtomicU64::new(0);
    for_each_parallel(shards, workers, |k| -> anyhow::Result<()> {
        let mut w = ShardWriter::new(
            &pattern,
            ShardWriterOptions {
                start_shard: k as u64,
                max_count: PER_SHARD as u64,
                ..Default::default()
            },
        )?;
        for i in k * PER_SHARD..((k + 1) * PER_SHARD).min(n) {
            let mut rng = SampleRng::for_sample(seed, u64::MAX - 2, i as u64);
            let class = rng.below(10) as usize;
            let count = 50 + rng.below(51) as usize;
            let video = chute::ops::video::synthetic_video(320, 240, count, 25, class as u64 * 29)?;
            frames.fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed);
            w.write(
                &format!("video{i:07}"),
                &[("cls", class.to_string().as_bytes()), ("mp4", &video)],
            )?;
        }
        w.finish()?;
        Ok(())
    })?;
    Ok((
        (0..shards)
            .map(|k| dir.join(format!("video-{k:06}.tar")))
            .collect(),
        frames.into_inner(),
    ))
}

/// The audio demo's ops: what a Whisper fine-tuning script does to each clip.
const AUDIO_OPS: &str = r#"{
    "wav": {"as": "features", "ops": [
        {"op": "decode_audio", "mono": true, "sample_rate": 16000},
        {"op": "log_mel", "n_mels": 80}
    ]},
    "cls": [{"op": "label"}]
}"#;

fn run_audio(args: DemoArgs) -> anyhow::Result<()> {
    let (_tmp, dir) = shard_dir(&args)?;
    let t = Instant::now();
    let (shards, seconds) = write_clips(&dir, args.clips, args.seed)?;
    if !args.json {
        println!(
            "chute demo: synthesized {} speech-like clips of 10 classes ({:.0} s of 44.1 kHz \
             audio, 16-bit WAV) in {:.2} s, as {} WebDataset shards in {}",
            args.clips,
            seconds,
            t.elapsed().as_secs_f64(),
            shards.len(),
            dir.display()
        );
    }
    let source = WebDatasetSource::open(&shards, WebDatasetOptions::default())?;
    let batch_size = args.batch_size.unwrap_or(16);
    let transform = SampleOps::from_json(AUDIO_OPS)?;
    let mut loader = loader_args(&args, batch_size, Some(transform)).build(Arc::new(source))?;
    if !args.json {
        println!(
            "training: {} clips; decode + resample to 16 kHz mono + Whisper log-mel on {} \
             workers; batches of {batch_size} as float32 [{batch_size}, 80, 3000] with int64 \
             labels; global shuffle, {} epochs, {} ms simulated step",
            loader.source().manifest().total_samples(),
            loader.options().num_workers,
            args.epochs,
            args.step_ms
        );
    }
    let summary = train(&mut loader, &args)?;
    if !args.json {
        println!(
            "audio: {:.0} clips/s ({:.0} s of audio per second); the training step waited {:.1}% \
             of the time",
            summary.samples_per_sec,
            summary.samples_per_sec * seconds / args.clips.max(1) as f64,
            summary.wait_fraction * 100.0
        );
    }
    Ok(())
}

/// Writes `n` clips (see [`synth`]) with their labels as WebDataset shards of 128 clips, in
/// parallel; gives the shards and the seconds of audio.
fn write_clips(dir: &Path, n: usize, seed: u64) -> anyhow::Result<(Vec<std::path::PathBuf>, f64)> {
    const PER_SHARD: usize = 128;
    let shards = n.div_ceil(PER_SHARD);
    let pattern = dir.join("audio-%06d.tar").display().to_string();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let frames = std::sync::atomic::AtomicU64::new(0);
    for_each_parallel(shards, workers, |k| -> anyhow::Result<()> {
        let mut w = ShardWriter::new(
            &pattern,
            ShardWriterOptions {
                start_shard: k as u64,
                max_count: PER_SHARD as u64,
                ..Default::default()
            },
        )?;
        for i in k * PER_SHARD..((k + 1) * PER_SHARD).min(n) {
            let mut rng = SampleRng::for_sample(seed, u64::MAX - 1, i as u64);
            let class = rng.below(10) as usize;
            let samples = synth(class, &mut rng);
            frames.fetch_add(samples.len() as u64, std::sync::atomic::Ordering::Relaxed);
            w.write(
                &format!("clip{i:07}"),
                &[
                    ("cls", class.to_string().as_bytes()),
                    ("wav", &wav(&samples)),
                ],
            )?;
        }
        w.finish()?;
        Ok(())
    })?;
    let seconds = frames.into_inner() as f64 / f64::from(DEMO_RATE);
    Ok((
        (0..shards)
            .map(|k| dir.join(format!("audio-{k:06}.tar")))
            .collect(),
        seconds,
    ))
}

const DEMO_RATE: u32 = 44_100;

/// 1 to 12 s of speech-like sound: syllables of a buzz at a class's pitch through two
/// formant-like resonances, with noise and pauses.
fn synth(class: usize, rng: &mut SampleRng) -> Vec<i16> {
    let rate = f64::from(DEMO_RATE);
    let n = (rng.uniform(1.0, 12.0) * rate) as usize;
    let pitch = 90.0 + 15.0 * class as f64;
    let (f1, f2) = (300.0 + 40.0 * class as f64, 1200.0 + 120.0 * class as f64);
    let mut out = Vec::with_capacity(n);
    let (mut phase, mut syllable, mut left) = (0.0f64, 0.0f64, 0usize);
    for i in 0..n {
        if left == 0 {
            left = (rng.uniform(0.12, 0.35) * rate) as usize;
            syllable = if rng.chance(0.2) {
                0.0
            } else {
                rng.uniform(0.2, 0.8)
            };
        }
        left -= 1;
        let t = i as f64 / rate;
        phase += pitch * (1.0 + 0.02 * (6.0 * t).sin()) / rate;
        let buzz = 2.0 * (phase - phase.floor()) - 1.0;
        let voiced = 0.6 * (2.0 * std::f64::consts::PI * f1 * t).sin() * buzz
            + 0.3 * (2.0 * std::f64::consts::PI * f2 * t).sin() * buzz;
        let noise = (rng.next_f64() - 0.5) * 0.05;
        out.push(((voiced * syllable + noise) * 0.8 * 32767.0) as i16);
    }
    out
}

/// A mono 16-bit PCM WAV file.
fn wav(samples: &[i16]) -> Vec<u8> {
    let data = (samples.len() * 2) as u32;
    let mut b = Vec::with_capacity(44 + samples.len() * 2);
    b.extend_from_slice(b"RIFF");
    b.extend_from_slice(&(36 + data).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&DEMO_RATE.to_le_bytes());
    b.extend_from_slice(&(DEMO_RATE * 2).to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(b"data");
    b.extend_from_slice(&data.to_le_bytes());
    for s in samples {
        b.extend_from_slice(&s.to_le_bytes());
    }
    b
}
