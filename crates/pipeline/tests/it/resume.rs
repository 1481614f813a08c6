use chute_core::{STATE_VERSION, Shuffle, StateError};
use chute_pipeline::Loader;
use chute_pipeline::check::{check_resume, run_to_end};

use crate::support::{Synthetic, noise};

#[test]
fn resumes_from_every_batch_in_every_mode_across_epochs() {
    for shuffle in [
        Shuffle::None,
        Shuffle::Global,
        Shuffle::Block { window: 2 },
        Shuffle::Block { window: 1 },
    ] {
        for (drop_last, workers, rank) in [(false, 0, 0), (true, 2, 1), (false, 3, 2)] {
            let make = || {
                Loader::builder(Synthetic::new(&[9, 14, 0, 6]))
                    .batch_size(4)
                    .shuffle(shuffle)
                    .seed(21)
                    .drop_last(drop_last)
                    .distributed(rank, 3)
                    .num_workers(workers)
                    .epoch(1)
                    .transform(noise)
                    .build()
                    .unwrap()
            };
            check_resume(make, 3).unwrap_or_else(|e| {
                panic!("{shuffle} drop_last={drop_last} workers={workers} rank={rank}: {e}")
            });
        }
    }
}

#[test]
fn state_reflects_delivered_batches_not_prefetched_ones() {
    let mut loader = Loader::builder(Synthetic::new(&[100]))
        .batch_size(10)
        .num_workers(4)
        .prefetch(8)
        .build()
        .unwrap();
    loader.next().unwrap().unwrap();
    loader.next().unwrap().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50)); // let the workers run ahead
    assert_eq!(loader.state().delivered, 20);
}

#[test]
fn foreign_or_future_states_are_refused() {
    let mut a = Loader::builder(Synthetic::new(&[10]))
        .batch_size(2)
        .build()
        .unwrap();
    a.next();
    let state = a.state();

    let mut other = Loader::builder(Synthetic::new(&[11]))
        .batch_size(2)
        .build()
        .unwrap();
    let e = other.restore(&state).unwrap_err();
    assert!(matches!(e, StateError::Dataset { .. }), "{e}");
    assert!(e.to_string().contains("another dataset"));

    let mut future = state.clone();
    future.version = STATE_VERSION + 1;
    let e = a.restore(&future).unwrap_err();
    assert!(matches!(e, StateError::Version { .. }), "{e}");

    let mut reseeded = Loader::builder(Synthetic::new(&[10]))
        .batch_size(2)
        .seed(9)
        .build()
        .unwrap();
    let e = reseeded.restore(&state).unwrap_err();
    assert!(e.to_string().contains("seed"), "{e}");
}

#[test]
fn elastic_resume_on_another_world_size_reads_the_rest_exactly_once() {
    let make = |rank, world| {
        Loader::builder(Synthetic::new(&[50, 47]))
            .batch_size(4)
            .shuffle(Shuffle::Global)
            .seed(8)
            .drop_last(true)
            .distributed(rank, world)
            .build()
            .unwrap()
    };
    // Two ranks read 5 batches each, then the job restarts on three ranks.
    let mut seen = Vec::new();
    let mut state = None;
    for rank in 0..2 {
        let mut l = make(rank, 2);
        for _ in 0..5 {
            seen.extend(l.next().unwrap().unwrap().ids);
        }
        state = Some(l.state());
    }
    let state = state.unwrap();
    for rank in 0..3 {
        let mut l = make(rank, 3);
        l.restore(&state).unwrap();
        let rest = run_to_end(&mut l, 0).unwrap();
        seen.extend(rest.into_iter().flat_map(|(_, d)| d.ids));
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "no sample twice");
    assert!(
        97 - n < 3 * 4,
        "only a remainder smaller than a global batch is dropped ({n})"
    );

    let mut block = Loader::builder(Synthetic::new(&[50, 47]))
        .shuffle(Shuffle::block())
        .distributed(0, 2)
        .build()
        .unwrap();
    let s = block.state();
    let mut block3 = Loader::builder(Synthetic::new(&[50, 47]))
        .shuffle(Shuffle::block())
        .distributed(0, 3)
        .build()
        .unwrap();
    assert!(
        block3
            .restore(&s)
            .unwrap_err()
            .to_string()
            .contains("world_size")
    );
    let _ = block.next();
}
