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

/// Ranks of each world size read some batches and checkpoint; the next world size (with
/// the global batch kept: per-rank batch = 24 / W) reads on; the last one reads to the end.
/// Returns every id delivered, in order of delivery per stage.
fn elastic_chain(shuffle: Shuffle, worlds: &[u64], steps: &[usize], drop_last: bool) -> Vec<u64> {
    let make = |rank, world: u64| {
        Loader::builder(Synthetic::new(&[50, 47, 31, 64, 9]))
            .batch_size(24 / world as usize)
            .shuffle(shuffle)
            .seed(8)
            .drop_last(drop_last)
            .distributed(rank, world)
            .build()
            .unwrap()
    };
    let mut seen = Vec::new();
    let mut state = None;
    for (k, &world) in worlds.iter().enumerate() {
        let mut next_state = None;
        for rank in 0..world {
            let mut l = make(rank, world);
            if let Some(s) = &state {
                l.restore(s).unwrap();
            }
            match steps.get(k) {
                Some(&n) => {
                    for _ in 0..n {
                        seen.extend(l.next().unwrap().unwrap().ids);
                    }
                    next_state = Some(l.state());
                }
                None => {
                    let rest = run_to_end(&mut l, 0).unwrap();
                    seen.extend(rest.into_iter().flat_map(|(_, d)| d.ids));
                }
            }
        }
        state = next_state;
    }
    seen
}

#[test]
fn elastic_resume_on_another_world_size_reads_the_rest_exactly_once() {
    let total = 50 + 47 + 31 + 64 + 9;
    for shuffle in [
        Shuffle::None,
        Shuffle::Global,
        Shuffle::block(),
        Shuffle::Block { window: 2 },
    ] {
        // 4 ranks -> 3 -> 2, dropping the last partial batches: nothing twice, and only
        // less than the last world size's global batch unread.
        let mut seen = elastic_chain(shuffle, &[4, 3, 2], &[2, 1], true);
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), n, "{shuffle}: no sample twice");
        assert!(
            total - n < 24,
            "{shuffle}: only a remainder is left ({n} of {total})"
        );
        // Keeping the last batches: every sample, repeats only as padding.
        let mut seen = elastic_chain(shuffle, &[4, 3, 2], &[3, 2], false);
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), total, "{shuffle}: every sample");
        assert!(
            n - total < 2,
            "{shuffle}: only the last world size's padding repeats"
        );
        // Growing as well as shrinking.
        let mut seen = elastic_chain(shuffle, &[2, 3, 1, 4], &[2, 3, 1], true);
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), n, "{shuffle}: no sample twice");
        assert!(total - n < 24, "{shuffle}: only a remainder is left");
    }

    // A hostile state: taken ranges out of order are refused, naming them.
    let mut l = Loader::builder(Synthetic::new(&[50, 47]))
        .shuffle(Shuffle::block())
        .distributed(0, 2)
        .build()
        .unwrap();
    let mut s = l.state();
    s.taken = vec![(30, 40), (10, 20)];
    let e = l.restore(&s).unwrap_err();
    assert!(e.to_string().contains("taken"), "{e}");
    s.taken = vec![(30, 4000)];
    assert!(l.restore(&s).is_err());
    // A world size no job has: refused at once (an elastic resume walks the old ranks).
    s.taken.clear();
    s.world_size = 1 << 60;
    let e = l.restore(&s).unwrap_err();
    assert!(e.to_string().contains("world_size"), "{e}");
    assert!(
        l.next().is_some(),
        "a refused state leaves the loader as it was"
    );
}
