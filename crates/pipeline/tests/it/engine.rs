use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chute_core::{BoxError, Column, Error, Sample, SampleRng, Shuffle};
use chute_pipeline::check::{check_matrix, run_to_end};
use chute_pipeline::{Autotune, Loader};

use crate::support::{Synthetic, noise};

const MODES: [Shuffle; 4] = [
    Shuffle::None,
    Shuffle::Global,
    Shuffle::Block { window: 2 },
    Shuffle::Block { window: 1 },
];

#[test]
fn stream_is_identical_for_every_worker_count_and_prefetch_depth() {
    for shuffle in MODES {
        for drop_last in [false, true] {
            let make = |w: usize, p: usize| {
                Loader::builder(Synthetic::new(&[37, 0, 50, 13]))
                    .batch_size(8)
                    .shuffle(shuffle)
                    .seed(11)
                    .drop_last(drop_last)
                    .num_workers(w)
                    .prefetch(p)
                    .transform(noise)
                    .build()
                    .unwrap()
            };
            check_matrix(make, &[0, 1, 2, 4, 8], &[1, 2, 8], 2)
                .unwrap_or_else(|e| panic!("{shuffle} drop_last={drop_last}: {e}"));
        }
    }
}

#[test]
fn an_autotuned_stream_is_the_fixed_one() {
    for shuffle in [Shuffle::None, Shuffle::Global] {
        let make = |w: usize, p: usize, tune: Option<usize>| {
            let b = Loader::builder(Synthetic::new(&[37, 0, 50, 13]))
                .batch_size(8)
                .shuffle(shuffle)
                .seed(11)
                .num_workers(w)
                .prefetch(p)
                .transform(noise);
            match tune {
                Some(initial) => b.autotune(Autotune {
                    initial_workers: initial,
                    memory_budget: 1 << 30,
                }),
                None => b,
            }
            .build()
            .unwrap()
        };
        let digest = |mut l: Loader| {
            let mut out = Vec::new();
            for epoch in 0..3 {
                for b in &mut l {
                    out.push(chute_pipeline::batch_digest(&b.unwrap()));
                }
                assert_eq!(l.epoch(), epoch + 1);
            }
            out
        };
        let fixed = digest(make(2, 2, None));
        for (w, p, initial) in [(4, 8, 1), (4, 8, 4), (1, 1, 1), (3, 2, 2)] {
            let l = make(w, p, Some(initial));
            let a = l.stats().autotune.expect("autotune stats");
            assert_eq!((a.max_workers, a.max_prefetch), (w as u64, p as u64));
            assert_eq!(a.workers, initial.min(w) as u64);
            assert_eq!(digest(l), fixed, "{shuffle} workers<={w} prefetch<={p}");
        }
    }
    // Autotuning needs workers to tune.
    let e = Loader::builder(Synthetic::new(&[8]))
        .autotune(Autotune {
            initial_workers: 1,
            memory_budget: 1 << 30,
        })
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("num_workers"), "{e}");
}

#[test]
fn an_epoch_ends_with_its_last_batch_and_a_new_pass_reads_the_next() {
    let make = || {
        Loader::builder(Synthetic::new(&[10, 7]))
            .batch_size(4)
            .shuffle(Shuffle::Global)
            .seed(5)
            .num_workers(2)
            .build()
            .unwrap()
    };
    let epoch = |l: &mut Loader| -> Vec<Vec<u64>> { l.map(|b| b.unwrap().ids).collect() };
    let mut reference = make();
    let whole: Vec<_> = (0..3).map(|_| epoch(&mut reference)).collect();

    let mut loader = make();
    let n = loader.len();
    for (e, want) in whole.iter().enumerate() {
        loader.begin_pass();
        let got: Vec<_> = (0..n)
            .map(|_| loader.next().unwrap().unwrap().ids)
            .collect();
        assert_eq!(&got, want, "epoch {e}: exactly len() batches");
        // Over with its last batch: the epoch and the state name the next one already.
        assert_eq!(loader.epoch(), e as u64 + 1);
        assert_eq!(
            (loader.state().epoch, loader.state().delivered),
            (e as u64 + 1, 0)
        );
    }
    // Without a new pass, the consumer that asks gets the closing `None` once.
    assert!(loader.next().is_none());
    let head = reference.next().unwrap().unwrap().ids; // epoch 3's first batch
    assert_eq!(loader.next().unwrap().unwrap().ids, head);
}

#[test]
fn batches_hold_collated_rows_in_plan_order() {
    let mut loader = Loader::builder(Synthetic::new(&[10]))
        .batch_size(4)
        .shuffle(Shuffle::Global)
        .seed(3)
        .num_workers(2)
        .build()
        .unwrap();
    let plan: Vec<u64> = loader.plan().unwrap().iter().collect();
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    for batch in &mut loader {
        let batch = batch.unwrap();
        let x = batch.get("x").unwrap().as_tensor().unwrap();
        assert_eq!(x.shape(), [batch.len(), 3]);
        let x = x.as_slice::<i64>().unwrap();
        for (row, &id) in batch.ids.iter().enumerate() {
            assert_eq!(
                &x[row * 3..row * 3 + 3],
                &[id as i64, id as i64 + 1, id as i64 + 2]
            );
        }
        let Some(Column::Var(keys)) = batch.get("key") else {
            panic!("key column")
        };
        assert_eq!(keys.get(0), format!("k{}", batch.ids[0]).as_bytes());
        sizes.push(batch.len());
        ids.extend(batch.ids.iter().copied());
    }
    assert_eq!(ids, plan);
    assert_eq!(sizes, [4, 4, 2]);
    assert_eq!(loader.epoch(), 1, "the loader moved to the next epoch");
    let next: Vec<u64> = loader.plan().unwrap().iter().collect();
    assert_ne!(next, plan, "a new epoch, a new order");
}

#[test]
fn augmentation_randomness_depends_on_epoch_not_workers() {
    let noise_of = |workers: usize, epoch: u64| {
        let mut loader = Loader::builder(Synthetic::new(&[16]))
            .batch_size(16)
            .num_workers(workers)
            .epoch(epoch)
            .transform(noise)
            .build()
            .unwrap();
        let batch = loader.next().unwrap().unwrap();
        batch
            .get("noise")
            .unwrap()
            .as_tensor()
            .unwrap()
            .as_slice::<u64>()
            .unwrap()
            .to_vec()
    };
    assert_eq!(noise_of(0, 0), noise_of(4, 0));
    assert_ne!(noise_of(0, 0), noise_of(0, 1));
}

#[test]
fn ranks_partition_each_epoch_with_equal_batch_counts() {
    for shuffle in MODES {
        for drop_last in [false, true] {
            let mut all = Vec::new();
            let mut counts = Vec::new();
            for rank in 0..3 {
                let mut loader = Loader::builder(Synthetic::new(&[20, 21, 3]))
                    .batch_size(5)
                    .shuffle(shuffle)
                    .seed(5)
                    .drop_last(drop_last)
                    .distributed(rank, 3)
                    .num_workers(2)
                    .build()
                    .unwrap();
                let got = run_to_end(&mut loader, 0).unwrap();
                counts.push(got.len());
                all.extend(got.into_iter().flat_map(|(_, d)| d.ids));
            }
            assert!(
                counts.iter().all(|&c| c == counts[0]),
                "{shuffle}: {counts:?}"
            );
            all.sort();
            let unique = {
                let mut u = all.clone();
                u.dedup();
                u
            };
            if drop_last {
                assert_eq!(unique.len(), all.len(), "no repeats");
                assert_eq!(
                    all.len(),
                    3 * 2 * 5,
                    "44 samples / 3 ranks = 14 each = 2 batches of 5"
                );
            } else {
                assert_eq!(
                    unique,
                    (0..44).collect::<Vec<_>>(),
                    "{shuffle}: every sample"
                );
                assert_eq!(all.len(), 45, "one repeat pads 44 to 3 x 15");
            }
        }
    }
}

#[test]
fn transform_error_names_the_sample_and_iteration_goes_on() {
    let failing = |s: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> {
        if s.index == 13 {
            Err("bad pixels".into())
        } else {
            Ok(())
        }
    };
    for workers in [0, 3] {
        let mut loader = Loader::builder(Synthetic::new(&[10, 10]))
            .batch_size(4)
            .num_workers(workers)
            .transform(failing)
            .build()
            .unwrap();
        let results: Vec<_> = (&mut loader).collect();
        assert_eq!(results.len(), 5);
        let err = results[3].as_ref().unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Transform { .. }), "{msg}");
        assert!(
            msg.contains("sample 13") && msg.contains("s1") && msg.contains("bad pixels"),
            "{msg}"
        );
        assert!(
            results[4].is_ok(),
            "the batch after the failed one is delivered"
        );
        assert_eq!(loader.stats().errors, 1);
    }
}

#[test]
fn transform_panic_is_an_error_not_a_hang() {
    let panicky = |s: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> {
        assert!(s.index != 6, "boom at six");
        Ok(())
    };
    for workers in [0, 1, 4] {
        let mut loader = Loader::builder(Synthetic::new(&[12]))
            .batch_size(4)
            .num_workers(workers)
            .prefetch(1)
            .transform(panicky)
            .build()
            .unwrap();
        let results: Vec<_> = (&mut loader).collect();
        let err = results[1].as_ref().unwrap_err();
        assert!(matches!(err, Error::WorkerPanicked { .. }), "{err}");
        assert!(err.to_string().contains("sample 6") && err.to_string().contains("boom at six"));
        assert!(results[0].is_ok() && results[2].is_ok());
    }
}

#[test]
fn dropping_mid_epoch_stops_the_threads_promptly() {
    /// Counts transform calls; every worker thread holds a clone of the transform (through
    /// the run), so the token's count tells whether any thread is still alive.
    struct Slow {
        calls: Arc<AtomicUsize>,
        alive: Arc<()>,
    }
    impl chute_core::Transform for Slow {
        fn apply(&self, _: &mut Sample, _: &mut SampleRng) -> Result<(), BoxError> {
            let _hold = Arc::clone(&self.alive);
            self.calls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        }
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let alive = Arc::new(());
    // 4 workers, batches of 50 samples at 20 ms each: one batch takes a worker a second.
    let mut loader = Loader::builder(Synthetic::new(&[100_000]))
        .batch_size(50)
        .num_workers(4)
        .transform(Slow {
            calls: Arc::clone(&calls),
            alive: Arc::clone(&alive),
        })
        .build()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        0,
        "no work before the first next()"
    );
    let first = loader.next().unwrap().unwrap();
    assert_eq!(first.len(), 50);
    let t = Instant::now();
    drop(loader);
    let took = t.elapsed();
    // Workers stop between samples, so the drop waits for at most one sample per worker
    // (20 ms), not for the rest of their batches (up to a second).
    assert!(took < Duration::from_millis(500), "drop took {took:?}");
    assert_eq!(
        Arc::strong_count(&alive),
        1,
        "no worker survives the loader"
    );
    let calls_at_drop = calls.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        calls_at_drop,
        "no work after the drop"
    );
    // Batches delivered before the drop stay valid.
    assert_eq!(
        first.get("x").unwrap().as_tensor().unwrap().shape(),
        [50, 3]
    );
}

#[test]
fn buffers_are_recycled_across_batches() {
    let mut loader = Loader::builder(Synthetic::new(&[4000]))
        .batch_size(100)
        .num_workers(2)
        .prefetch(2)
        .build()
        .unwrap();
    let mut addresses = std::collections::HashSet::new();
    for batch in &mut loader {
        let batch = batch.unwrap();
        addresses.insert(batch.get("x").unwrap().as_tensor().unwrap().data_ptr() as usize);
    }
    // 40 batches, but only as many distinct buffers as can be in flight at once.
    assert!(addresses.len() <= 8, "{} distinct buffers", addresses.len());
}

#[test]
fn invalid_options_are_refused_with_the_option_named() {
    let e = Loader::builder(Synthetic::new(&[4]))
        .batch_size(0)
        .build()
        .unwrap_err();
    assert_eq!(e.option, "batch_size");
    let e = Loader::builder(Synthetic::new(&[4]))
        .distributed(2, 2)
        .build()
        .unwrap_err();
    assert_eq!(e.option, "rank");
    let e = Loader::builder(Synthetic::new(&[4]))
        .num_workers(2)
        .prefetch(0)
        .build()
        .unwrap_err();
    assert_eq!(e.option, "prefetch");
}

#[test]
fn stats_count_stages_and_deliveries() {
    let mut loader = Loader::builder(Synthetic::new(&[64]))
        .batch_size(16)
        .num_workers(2)
        .transform(noise)
        .build()
        .unwrap();
    let n: usize = (&mut loader).map(|b| b.unwrap().len()).sum();
    let s = loader.stats();
    assert_eq!((n, s.samples, s.batches), (64, 64, 4));
    assert_eq!(
        (s.read.items, s.transform.items, s.collate.items),
        (64, 64, 4)
    );
    assert!(s.bytes >= 64 * 3 * 8);
    assert!(s.wait_fraction >= 0.0 && s.wait_fraction <= 1.0);
    let _ = Arc::new(s);
}

#[test]
fn skip_replaces_failed_samples_deterministically_and_counts_them() {
    let failing = |s: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> {
        if s.index % 7 == 3 {
            Err(format!("cannot decode {}", s.index).into())
        } else {
            Ok(())
        }
    };
    let make = |workers: usize, prefetch: usize| {
        Loader::builder(Synthetic::new(&[30, 25]))
            .batch_size(6)
            .shuffle(Shuffle::Global)
            .seed(4)
            .num_workers(workers)
            .prefetch(prefetch)
            .on_error(chute_core::OnError::Skip)
            .transform(failing)
            .build()
            .unwrap()
    };
    check_matrix(make, &[0, 2, 4], &[1, 3], 2).unwrap();
    let mut loader = make(2, 2);
    let got = run_to_end(&mut loader, 0).unwrap();
    let ids: Vec<u64> = got
        .iter()
        .flat_map(|(_, d)| d.ids.iter().copied())
        .collect();
    assert_eq!(ids.len(), 55, "batches stay full");
    assert!(
        ids.iter().all(|id| id % 7 != 3),
        "no failed sample is delivered"
    );
    let stats = loader.stats();
    assert_eq!(stats.skipped, (0..55).filter(|i| i % 7 == 3).count() as u64);
    assert!(
        stats
            .skipped_recent
            .iter()
            .any(|m| m.contains("cannot decode")),
        "{stats:?}"
    );
    assert_eq!(stats.errors, 0);
}

#[test]
fn skip_gives_up_after_a_long_run_of_bad_samples() {
    let all_bad = |_: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> { Err("bad".into()) };
    let mut loader = Loader::builder(Synthetic::new(&[40]))
        .batch_size(4)
        .on_error(chute_core::OnError::Skip)
        .transform(all_bad)
        .build()
        .unwrap();
    let err = loader.next().unwrap().unwrap_err();
    assert!(err.to_string().contains("bad"), "{err}");
}

#[test]
fn next_timeout_returns_pending_without_consuming() {
    let slow = |_: &mut Sample, _: &mut SampleRng| -> Result<(), BoxError> {
        std::thread::sleep(Duration::from_millis(30));
        Ok(())
    };
    let mut loader = Loader::builder(Synthetic::new(&[8]))
        .batch_size(4)
        .num_workers(1)
        .transform(slow)
        .build()
        .unwrap();
    let mut pending = 0;
    let mut batches = Vec::new();
    loop {
        match loader.next_timeout(Duration::from_millis(5)) {
            chute_pipeline::Poll::Pending => pending += 1,
            chute_pipeline::Poll::Ready(Some(b)) => batches.push(b.unwrap().ids),
            chute_pipeline::Poll::Ready(None) => break,
        }
    }
    assert!(pending > 0, "a 120 ms batch is not ready within 5 ms");
    assert_eq!(batches.concat(), (0..8).collect::<Vec<_>>());
}

#[test]
fn pin_memory_without_cuda_falls_back_and_says_why() {
    let mut loader = Loader::builder(Synthetic::new(&[8]))
        .batch_size(4)
        .pin_memory(true)
        .build()
        .unwrap();
    if loader.pinned() {
        // A machine with a CUDA runtime and a GPU: the buffers are page-locked.
        assert!(loader.pin_memory_fallback().is_none());
    } else {
        let why = loader.pin_memory_fallback().expect("a reason");
        assert!(
            why.contains("libcudart") || why.contains("cudaHostAlloc"),
            "{why}"
        );
    }
    assert_eq!(loader.next().unwrap().unwrap().len(), 4);
}

#[test]
fn for_each_parallel_runs_every_job_once_and_reports_the_first_failure() {
    for threads in [0, 1, 3, 8] {
        let counts: Vec<AtomicUsize> = (0..50).map(|_| AtomicUsize::new(0)).collect();
        chute_pipeline::for_each_parallel(50, threads, |n| {
            counts[n].fetch_add(1, Ordering::Relaxed);
            Ok::<(), String>(())
        })
        .unwrap();
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        // Jobs 7 and 9 fail: jobs are claimed in order and a claimed job always runs, so
        // job 7's failure is the one returned, whichever failed first; later jobs stop.
        let ran = AtomicUsize::new(0);
        let err = chute_pipeline::for_each_parallel(10_000, threads, |n| {
            ran.fetch_add(1, Ordering::Relaxed);
            if n == 7 || n == 9 { Err(n) } else { Ok(()) }
        })
        .unwrap_err();
        assert_eq!(err, 7);
        if threads <= 1 {
            assert_eq!(ran.load(Ordering::Relaxed), 8);
        }
        assert!(
            ran.load(Ordering::Relaxed) < 10_000,
            "no new job after a failure"
        );
    }
}

/// The first batch's reads are shared among the workers (`workers::Assist`); reads that fail
/// in it are replaced (skip) or reported exactly as with one worker, and later batches too.
#[test]
fn failed_reads_in_the_shared_first_batch_match_one_worker() {
    use chute_core::{Array, DType, Field, FnSource};
    let read = |id: u64| -> Result<Sample, Error> {
        if id % 5 == 1 {
            return Err(Error::corrupt(
                "mem://flaky",
                id,
                format!("sample {id} is bad"),
            ));
        }
        let v = bytes::Bytes::copy_from_slice(&(id as i64).to_le_bytes());
        Ok(Sample::new(id).with("v", Field::Array(Array::new(DType::I64, vec![], v))))
    };
    let make = |workers: usize, prefetch: usize| {
        Loader::builder(FnSource::new("flaky", 200, read))
            .batch_size(64)
            .shuffle(Shuffle::Global)
            .seed(9)
            .num_workers(workers)
            .prefetch(prefetch)
            .on_error(chute_core::OnError::Skip)
            .build()
            .unwrap()
    };
    check_matrix(make, &[0, 1, 2, 4, 8], &[1, 2], 2).unwrap();
    let mut loader = make(4, 2);
    let got = run_to_end(&mut loader, 0).unwrap();
    let ids: Vec<u64> = got
        .iter()
        .flat_map(|(_, d)| d.ids.iter().copied())
        .collect();
    assert!(
        ids.iter().all(|id| id % 5 != 1),
        "no failed sample is delivered"
    );
    // With on_error=raise the first batch fails naming a bad sample, whoever read it.
    let mut strict = Loader::builder(FnSource::new("flaky", 200, read))
        .batch_size(64)
        .num_workers(4)
        .build()
        .unwrap();
    let e = strict.next().unwrap().unwrap_err().to_string();
    assert!(e.contains("sample 1 is bad"), "{e}");
}

/// Which thread transformed each sample.
type Threads = Arc<std::sync::Mutex<std::collections::HashMap<u64, std::thread::ThreadId>>>;

/// A slow transform writing a slot (`y`: the sample's RNG draw and index, as a native op
/// writes its pixels into the batch), failing on the indices in `bad`, and noting which
/// thread transformed each sample.
struct Tail {
    slots: Vec<chute_core::Slot>,
    bad: Vec<u64>,
    threads: Threads,
}

impl chute_core::Transform for Tail {
    fn apply(&self, s: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
        std::thread::sleep(Duration::from_millis(15));
        self.threads
            .lock()
            .unwrap()
            .insert(s.index, std::thread::current().id());
        if self.bad.contains(&s.index) {
            return Err(format!("bad sample {}", s.index).into());
        }
        let v = [rng.next_u64(), s.index];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        s.set(
            "y",
            chute_core::Field::Array(chute_core::Array::new(
                chute_core::DType::U64,
                vec![2],
                bytes::Bytes::from(bytes),
            )),
        );
        Ok(())
    }

    fn slots(&self) -> &[chute_core::Slot] {
        &self.slots
    }
}

fn tail_loader(
    workers: usize,
    bad: &[u64],
    on_error: chute_core::OnError,
) -> (
    Loader,
    Arc<std::sync::Mutex<std::collections::HashMap<u64, std::thread::ThreadId>>>,
) {
    let threads = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let loader = Loader::builder(Synthetic::new(&[20, 4]))
        .batch_size(8)
        .shuffle(Shuffle::Global)
        .seed(5)
        .num_workers(workers)
        .on_error(on_error)
        .transform(Tail {
            slots: vec![chute_core::Slot {
                name: "y".into(),
                dtype: chute_core::DType::U64,
                shape: vec![2],
            }],
            bad: bad.to_vec(),
            threads: Arc::clone(&threads),
        })
        .build()
        .unwrap();
    (loader, threads)
}

type Ys = Vec<Result<(Vec<u8>, Vec<u64>), String>>;

/// Each batch's `y` column and ids (or its error).
fn ys(loader: &mut Loader) -> Ys {
    loader
        .map(|b| {
            b.map(|b| {
                let y = b.get("y").and_then(Column::as_tensor).expect("a y tensor");
                (y.as_bytes().to_vec(), b.ids.clone())
            })
            .map_err(|e| e.to_string())
        })
        .collect()
}

#[test]
fn the_last_batches_are_transformed_by_the_idle_workers_too() {
    // 24 samples in batches of 8 and 2 workers: the worker that did not claim the last batch
    // has nothing to claim when it finishes its own, and helps with the last one.
    let (mut one, _) = tail_loader(1, &[], chute_core::OnError::Raise);
    let want = ys(&mut one);
    assert_eq!(want.len(), 3);
    for workers in [2] {
        let (mut loader, threads) = tail_loader(workers, &[], chute_core::OnError::Raise);
        for epoch in 0..2 {
            let got = ys(&mut loader);
            if epoch == 0 {
                assert_eq!(got, want, "{workers} workers");
            }
            let (_, ids) = got.last().unwrap().as_ref().unwrap();
            let threads = threads.lock().unwrap();
            let by: std::collections::HashSet<_> = ids.iter().map(|id| threads[id]).collect();
            assert!(
                by.len() >= 2,
                "{workers} workers, epoch {epoch}: the last batch's 8 samples (15 ms each) were \
                 transformed by {} thread(s)",
                by.len()
            );
        }
    }
}

#[test]
fn shared_transforms_fail_and_skip_as_one_worker_does() {
    // Samples 17 and 21 fail: the first failed sample of the batch (in its order) is the
    // batch's error; with skip, each is replaced by the next sample that transforms.
    let bad = [17, 21, 22];
    for on_error in [chute_core::OnError::Raise, chute_core::OnError::Skip] {
        let (mut one, _) = tail_loader(1, &bad, on_error);
        let want = ys(&mut one);
        for workers in [2, 3, 4] {
            let (mut loader, _) = tail_loader(workers, &bad, on_error);
            assert_eq!(ys(&mut loader), want, "{on_error:?}, {workers} workers");
        }
        assert!(
            want.iter().any(Result::is_err) == (on_error == chute_core::OnError::Raise),
            "{want:?}"
        );
    }
}

#[test]
fn a_run_of_one_batch_is_read_by_every_worker() {
    // One batch, three workers: the two without a batch read chunks of it (the shared first
    // batch), and the batch is what one worker reads.
    use chute_core::{Array, DType, Field, FnSource};
    let readers: Threads = Arc::default();
    let make = |workers: usize| {
        let readers = Arc::clone(&readers);
        let read = move |id: u64| -> Result<Sample, Error> {
            std::thread::sleep(Duration::from_millis(10));
            readers
                .lock()
                .unwrap()
                .insert(id, std::thread::current().id());
            let v = bytes::Bytes::copy_from_slice(&(id as i64).to_le_bytes());
            Ok(Sample::new(id).with("v", Field::Array(Array::new(DType::I64, vec![], v))))
        };
        Loader::builder(FnSource::new("slow", 48, read))
            .batch_size(64)
            .shuffle(Shuffle::Global)
            .seed(3)
            .num_workers(workers)
            .build()
            .unwrap()
    };
    let want = run_to_end(&mut make(1), 0).unwrap();
    readers.lock().unwrap().clear();
    let got = run_to_end(&mut make(3), 0).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.ids, want[0].1.ids);
    let by: std::collections::HashSet<_> = readers.lock().unwrap().values().copied().collect();
    assert!(by.len() >= 2, "48 reads of 10 ms by {} thread(s)", by.len());
}
