//! Mixtures through the engine: proportions per batch, resume from every batch, ranks,
//! elastic resumes and foreign states.

use std::sync::Arc;

use chute::core::{Array, Column, Field, FnSource, Sample, Shuffle, StateError};
use chute::dataset::{Component, MixMode, Mixture, Policy};
use chute::pipeline::Loader;
use chute::pipeline::check::{check_matrix, check_resume};

/// A component of `len` samples whose field `v` is `tag * 1_000_000 + id`.
fn comp(name: &str, tag: u64, len: u64) -> Component {
    let src = FnSource::new(name, len, move |id| {
        Ok(Sample::new(id).with(
            "v",
            Field::Array(Array::scalar_i64((tag * 1_000_000 + id) as i64)),
        ))
    });
    Component::new(name, Arc::new(src))
}

/// Three components (small ones, so they cycle within an epoch) and a schedule that changes
/// mid-epoch.
fn three(weights: [f64; 3], mode: MixMode) -> Mixture {
    Mixture::builder(vec![
        comp("web", 0, 37),
        comp("code", 1, 23),
        comp("math", 2, 11),
    ])
    .schedule(
        vec![(0, weights.to_vec()), (96, vec![0.2, 0.2, 0.6])],
        false,
    )
    .mode(mode)
    .samples_per_epoch(192)
    .source_column("source")
    .build()
    .unwrap()
}

fn column_i64(batch: &chute::core::Batch, name: &str) -> Vec<i64> {
    match batch.get(name) {
        Some(Column::Tensor(t)) => t
            .as_bytes()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        other => panic!("no {name}: {other:?}"),
    }
}

#[test]
fn every_batch_holds_each_share_across_a_schedule_change() {
    let mut loader = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
        .batch_size(16)
        .num_workers(2)
        .build()
        .unwrap();
    let mut position = 0u64;
    let mut batches = 0;
    for batch in &mut loader {
        let batch = batch.unwrap();
        let sources = column_i64(&batch, "source");
        let weights: &[f64] = if position < 96 {
            &[0.5, 0.3, 0.2]
        } else {
            &[0.2, 0.2, 0.6]
        };
        for (c, w) in weights.iter().enumerate() {
            let n = sources.iter().filter(|&&s| s == c as i64).count() as f64;
            let share = w * 16.0;
            assert!(
                n >= share.floor() && n <= share.ceil(),
                "batch at {position}: component {c} has {n} of 16, share {share}"
            );
        }
        // The values come from the component the source column names.
        for (v, s) in column_i64(&batch, "v").iter().zip(&sources) {
            assert_eq!(v / 1_000_000, *s);
        }
        position += 16;
        batches += 1;
    }
    assert_eq!(batches, 12);
    // Over the whole first segment, each share is exact (96 x weight within one).
    let stats = loader.stats().source.unwrap();
    let served = &stats["components"];
    assert_eq!(
        served["web"]["samples"].as_u64().unwrap()
            + served["code"]["samples"].as_u64().unwrap()
            + served["math"]["samples"].as_u64().unwrap(),
        192
    );
}

#[test]
fn metrics_show_each_component_against_its_target() {
    let mut loader = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
        .batch_size(16)
        .name("mixture-metrics")
        .build()
        .unwrap();
    for batch in (&mut loader).take(6) {
        batch.unwrap();
    }
    let stats = loader.stats().source.unwrap();
    let text = chute::pipeline::metrics::render();
    for name in ["web", "code", "math"] {
        let labels = format!(r#"rank="0",loader="mixture-metrics",component="{name}""#);
        let value = |metric: &str| -> f64 {
            let series = format!("{metric}{{{labels}}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&series)?.parse().ok())
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        };
        let c = &stats["components"][name];
        assert_eq!(
            value("chute_mixture_samples_total"),
            c["samples"].as_f64().unwrap()
        );
        assert_eq!(
            value("chute_mixture_target_ratio"),
            c["target"].as_f64().unwrap()
        );
    }
    assert!(text.contains("# TYPE chute_mixture_samples_total counter"));
}

#[test]
fn a_mixture_resumes_from_every_batch_across_component_epochs_and_a_schedule_change() {
    for mode in [MixMode::Stratified, MixMode::Random] {
        for (workers, rank, world) in [(0, 0, 1), (2, 1, 2), (3, 2, 3)] {
            let make = || {
                Loader::builder(three([0.5, 0.3, 0.2], mode))
                    .batch_size(8)
                    .seed(5)
                    .distributed(rank, world)
                    .num_workers(workers)
                    .build()
                    .unwrap()
            };
            check_resume(make, 3).unwrap_or_else(|e| panic!("{mode} {rank}/{world}: {e}"));
        }
    }
    let make = |workers, prefetch| {
        Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
            .batch_size(8)
            .num_workers(workers)
            .prefetch(prefetch)
            .build()
            .unwrap()
    };
    check_matrix(make, &[0, 1, 3], &[1, 4], 2).unwrap();
}

#[test]
fn ranks_take_disjoint_equal_runs_of_the_single_rank_stream() {
    let single: Vec<Vec<i64>> = {
        let mut l = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
            .batch_size(8)
            .build()
            .unwrap();
        (&mut l).map(|b| column_i64(&b.unwrap(), "v")).collect()
    };
    let world = 4;
    let mut counts = Vec::new();
    for rank in 0..world {
        let mut l = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
            .batch_size(8)
            .distributed(rank, world)
            .build()
            .unwrap();
        let batches: Vec<Vec<i64>> = (&mut l).map(|b| column_i64(&b.unwrap(), "v")).collect();
        counts.push(batches.len());
        for (j, b) in batches.iter().enumerate() {
            // Rank r's batch j is batch j * W + r of the single-rank stream.
            assert_eq!(
                b,
                &single[j * world as usize + rank as usize],
                "rank {rank} batch {j}"
            );
        }
    }
    assert_eq!(counts, vec![6; 4]);
}

#[test]
fn elastic_resume_four_to_three_to_two_reads_the_epoch_exactly_once() {
    let make = |rank, world| {
        Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
            .batch_size(4)
            .seed(3)
            .drop_last(true)
            .distributed(rank, world)
            .build()
            .unwrap()
    };
    let single: Vec<i64> = {
        let mut l = make(0, 1);
        (&mut l)
            .flat_map(|b| column_i64(&b.unwrap(), "v"))
            .collect()
    };
    let mut seen = Vec::new();
    let mut state = None;
    for rank in 0..4 {
        let mut l = make(rank, 4);
        for _ in 0..3 {
            seen.extend(column_i64(&l.next().unwrap().unwrap(), "v"));
        }
        state = Some(l.state());
    }
    let mut next = None;
    for rank in 0..3 {
        let mut l = make(rank, 3);
        l.restore(state.as_ref().unwrap()).unwrap();
        for _ in 0..2 {
            seen.extend(column_i64(&l.next().unwrap().unwrap(), "v"));
        }
        next = Some(l.state());
    }
    for rank in 0..2 {
        let mut l = make(rank, 2);
        l.restore(next.as_ref().unwrap()).unwrap();
        seen.extend((&mut l).flat_map(|b| column_i64(&b.unwrap(), "v")));
    }
    // The same samples as one rank's epoch, in the same stream positions (a multiset: the
    // small components repeat within the epoch).
    let mut a = seen.clone();
    let mut b = single[..seen.len()].to_vec();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "4 -> 3 -> 2 ranks read exactly the single-rank stream"
    );
    assert!(
        192 - seen.len() < 2 * 4,
        "only a remainder under a global batch is dropped"
    );
}

#[test]
fn states_of_another_mixture_and_shuffled_loaders_are_refused() {
    let mut a = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
        .batch_size(8)
        .build()
        .unwrap();
    a.next().unwrap().unwrap();
    let state = a.state();
    let mut b = Loader::builder(three([0.4, 0.4, 0.2], MixMode::Stratified))
        .batch_size(8)
        .build()
        .unwrap();
    let e = b.restore(&state).unwrap_err();
    assert!(
        matches!(&e, StateError::Definition { differs } if differs == &["weights".to_string()]),
        "{e}"
    );
    assert!(e.to_string().contains("weights differs"), "{e}");

    let mut c = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
        .batch_size(4)
        .build()
        .unwrap();
    let e = c.restore(&state).unwrap_err();
    assert!(e.to_string().contains("batch_size differs"), "{e}");

    // `global` agrees with components that shuffle themselves: the plan stays in order.
    let on = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
        .shuffle(Shuffle::Global)
        .build()
        .unwrap();
    assert_eq!(on.state().shuffle, Shuffle::None);
    let e = Loader::builder(three([0.5, 0.3, 0.2], MixMode::Stratified))
        .shuffle(Shuffle::block())
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("orders its own samples"), "{e}");
}

#[test]
fn stop_on_first_ends_the_epoch_when_the_smallest_share_runs_out() {
    let m = Mixture::builder(vec![comp("a", 0, 100), comp("b", 1, 10)])
        .weights(vec![0.5, 0.5])
        .policy(Policy::StopOnFirst)
        .build()
        .unwrap();
    let mut l = Loader::builder(m).batch_size(4).build().unwrap();
    let vs: Vec<i64> = (&mut l)
        .flat_map(|b| column_i64(&b.unwrap(), "v"))
        .collect();
    assert_eq!(vs.len(), 20);
    let mut b: Vec<i64> = vs
        .iter()
        .filter(|&&v| v >= 1_000_000)
        .map(|v| v - 1_000_000)
        .collect();
    b.sort();
    assert_eq!(
        b,
        (0..10).collect::<Vec<_>>(),
        "b's whole epoch, each sample once"
    );
}
