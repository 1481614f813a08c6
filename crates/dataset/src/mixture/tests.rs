//! The mixture's unit tests: the schedule's arithmetic, draws, reads and ranks.

use std::sync::Arc;

use chute_core::{
    Array, BufferPool, Column, Error, Field, Manifest, Plan, PlanConfig, Sample, SampleRng, Source,
    Tensor, virtual_manifest,
};

use super::schedule::*;
use super::source::*;
use super::*;
use chute_core::{DType, FnSource};

/// `edf` as first written (each step recomputes every component's release and deadline
/// and sorts them): the stream chute has always drawn, which the faster `edf` must give
/// bit for bit (a mixture's order is part of its states and digests).
fn edf_reference(rates: &[u64], steps: u64, picks: usize) -> Vec<u16> {
    let k = rates.len();
    let mut counts = vec![0u64; k];
    let mut out = Vec::with_capacity(steps as usize * picks);
    let mut due: Vec<(u64, usize)> = Vec::with_capacity(k);
    for t in 0..steps {
        due.clear();
        for c in 0..k {
            let rate = rates[c];
            if rate == 0 || counts[c] >= rate {
                continue;
            }
            if counts[c] * steps < (t + 1) * rate {
                due.push((((counts[c] + 1) * steps).div_ceil(rate), c));
            }
        }
        due.sort_unstable();
        for &(_, c) in due.iter().take(picks) {
            out.push(c as u16);
            counts[c] += 1;
        }
        for _ in due.len()..picks {
            let c = (0..k).find(|&c| counts[c] < rates[c]).unwrap_or(0);
            out.push(c as u16);
            counts[c] += 1;
        }
    }
    out
}

#[test]
fn edf_draws_what_it_always_drew() {
    let mut rng = SampleRng::from_key(99);
    for case in 0..300 {
        let k = 1 + rng.below(8) as usize;
        let picks = 1 + rng.below(k.min(4) as u64) as usize;
        let steps = if case % 10 == 0 {
            QUANTUM
        } else {
            1 + rng.below(3000)
        };
        // Rates summing to picks * steps, as callers give them, or (one case in five) any.
        let mut rates: Vec<u64> = (0..k).map(|_| rng.below(steps + 1)).collect();
        if case % 5 != 0 {
            let total = picks as u64 * steps;
            let sum: u64 = rates.iter().sum::<u64>().max(1);
            rates = rates.iter().map(|r| r * total / sum).collect();
            let short = total - rates.iter().sum::<u64>();
            rates[0] += short;
        }
        assert_eq!(
            edf(&rates, steps, picks),
            edf_reference(&rates, steps, picks),
            "rates {rates:?}, steps {steps}, picks {picks}"
        );
    }
}

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

fn value(s: &Sample) -> u64 {
    match s.get("v") {
        Some(Field::Array(a)) => {
            assert_eq!(a.dtype, DType::I64);
            i64::from_le_bytes(a.data[..8].try_into().unwrap()) as u64
        }
        other => panic!("no v: {other:?}"),
    }
}

#[test]
fn stratified_prefixes_hold_each_share_within_one() {
    for weights in [
        vec![0.5, 0.3, 0.2],
        vec![0.61, 0.07, 0.32],
        vec![0.25, 0.25, 0.25, 0.25],
        vec![0.9, 0.05, 0.03, 0.01, 0.01],
        vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
    ] {
        let k = weights.len();
        let m = Mixture::builder(
            (0..k)
                .map(|c| comp(&format!("c{c}"), c as u64, 1000))
                .collect(),
        )
        .weights(weights.clone())
        .samples_per_epoch(10_000)
        .build()
        .unwrap();
        let q = quotas(&m.points[0].1);
        let mut counts = vec![0u64; k];
        for g in 0..3 * QUANTUM {
            let (c, n) = m.locate(g, 0);
            assert_eq!(n, counts[c], "position {g}");
            counts[c] += 1;
            for (j, &cnt) in counts.iter().enumerate() {
                let target = q[j] as f64 * (g + 1) as f64 / QUANTUM as f64;
                assert!(
                    (cnt as f64 - target).abs() < 1.0,
                    "{weights:?} c{j} at {g}: {cnt} vs {target}"
                );
            }
        }
        // Every batch of 16 holds each share rounded down or up.
        for b in 0..2000u64 {
            let (lo, hi) = (b * 16, (b + 1) * 16);
            let (a, z) = (m.counts_before(lo, 0), m.counts_before(hi, 0));
            for j in 0..k {
                let share = q[j] as f64 * 16.0 / QUANTUM as f64;
                let n = (z[j] - a[j]) as f64;
                assert!(
                    n >= share.floor() - 1.0 && n <= share.ceil() + 1.0,
                    "batch {b} c{j}: {n} vs {share}"
                );
            }
        }
    }
}

#[test]
fn batches_hold_each_share_rounded_and_runs_of_them_stay_within_one() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..40 {
        let k = 2 + (next() % 5) as usize;
        let raw: Vec<f64> = (0..k).map(|_| (next() % 1000 + 1) as f64).collect();
        let b = [2, 3, 8, 16, 17, 64, 100, 256][round % 8];
        let m = Mixture::builder(
            (0..k)
                .map(|c| comp(&format!("c{c}"), c as u64, 50))
                .collect(),
        )
        .weights(raw.clone())
        .samples_per_epoch(b * 300 + 5)
        .build()
        .unwrap();
        let q = quotas(&m.points[0].1);
        let mut cum = vec![0u64; k];
        let mut r = Reading::new(&m);
        for j in 0..300u64 {
            let mut a = vec![0u64; k];
            for t in 0..b {
                let (c, n) = m.draw(j * b + t, 0, b, &mut r);
                assert_eq!(n, cum[c] + a[c], "{raw:?} b={b} batch {j} offset {t}");
                a[c] += 1;
            }
            for c in 0..k {
                let share = q[c] as f64 * b as f64 / QUANTUM as f64;
                assert!(
                    a[c] as f64 >= share.floor() && a[c] as f64 <= share.ceil(),
                    "{raw:?} b={b} batch {j}: c{c} has {} of share {share}",
                    a[c]
                );
                cum[c] += a[c];
                let target = share * (j + 1) as f64;
                assert!(
                    (cum[c] as f64 - target).abs() < 1.0,
                    "{raw:?} b={b} after {} batches: c{c} {} vs {target}",
                    j + 1,
                    cum[c]
                );
            }
        }
    }
}

#[test]
fn draw_numbers_run_on_across_epochs_and_past_the_schedule() {
    let m = Mixture::builder(vec![comp("a", 0, 9), comp("b", 1, 9), comp("c", 2, 9)])
        .schedule(
            vec![(0, vec![0.5, 0.3, 0.2]), (100, vec![0.1, 0.1, 0.8])],
            false,
        )
        .samples_per_epoch(70)
        .build()
        .unwrap();
    for b in [1, 8, 16, 70, 100] {
        let mut counts = [0u64; 3];
        let mut r = Reading::new(&m);
        for g in 0..70 * 12 {
            let (c, n) = m.draw(g, 0, b, &mut r);
            assert_eq!(n, counts[c], "b={b} position {g}");
            counts[c] += 1;
        }
    }
    let far = m.epoch_start(1_000_000_000_000, 8);
    assert_eq!(far.iter().sum::<u64>(), 70 * 1_000_000_000_000);
}

#[test]
fn hostile_sizes_are_refused_not_computed() {
    let many: Vec<(u64, Vec<f64>)> = (0..5000).map(|i| (i, vec![1.0, 1.0])).collect();
    let e = Mixture::builder(vec![comp("a", 0, 5), comp("b", 1, 5)])
        .schedule(many, false)
        .samples_per_epoch(10)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("schedule points"), "{e}");
    let e = Mixture::builder(vec![comp("a", 0, 5), comp("b", 1, 5)])
        .schedule(
            vec![(0, vec![1.0, 1.0]), (u64::MAX / 2, vec![1.0, 2.0])],
            false,
        )
        .samples_per_epoch(10)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("epochs of 10 samples away"), "{e}");
    let m = Mixture::builder(vec![comp("a", 0, 5), comp("b", 1, 5)])
        .weights(vec![1.0, 1.0])
        .mode(MixMode::Random)
        .samples_per_epoch(10)
        .build()
        .unwrap();
    let cfg = PlanConfig {
        epoch: u64::MAX / 20,
        ..PlanConfig::default()
    };
    m.set_plan(&Plan::new(m.manifest(), &cfg).unwrap());
    let e = m.read(3).unwrap_err();
    assert!(e.to_string().contains("random-mode mixture"), "{e}");
}

#[test]
fn components_cycle_through_their_own_epochs_reshuffled() {
    let m = Mixture::builder(vec![comp("a", 0, 10), comp("b", 1, 7)])
        .weights(vec![0.5, 0.5])
        .policy(Policy::StopOnFirst)
        .build()
        .unwrap();
    // b (7 samples at half the positions) runs out first: by position 14.
    assert_eq!(m.samples_per_epoch(), 14);
    let mut b_epochs: Vec<Vec<u64>> = vec![Vec::new(); 4];
    let mut a_seen = Vec::new();
    for g in 0..56 {
        let s = m.sample_at(g, 9, 1, g, &mut Reading::new(&m)).unwrap();
        let v = value(&s);
        if v >= 1_000_000 {
            let (_, k) = m.locate(g, 9);
            b_epochs[(k / 7) as usize].push(v - 1_000_000);
        } else {
            a_seen.push(v);
        }
    }
    for e in &b_epochs {
        let mut sorted = e.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..7).collect::<Vec<_>>(),
            "each epoch of b holds every sample once"
        );
    }
    assert_ne!(b_epochs[0], b_epochs[1], "the next epoch is reshuffled");
    let mut first: Vec<u64> = a_seen[..10].to_vec();
    first.sort();
    assert_eq!(first, (0..10).collect::<Vec<_>>());
    // stop_on_all: a (10 samples, drawn first) finishes last, after 19 positions.
    let all = Mixture::builder(vec![comp("a", 0, 10), comp("b", 1, 7)])
        .weights(vec![0.5, 0.5])
        .build()
        .unwrap();
    assert_eq!(all.samples_per_epoch(), 19);
}

#[test]
fn schedules_change_the_shares_at_their_points_and_ramps_move_smoothly() {
    let m = Mixture::builder(vec![comp("a", 0, 100), comp("b", 1, 100)])
        .schedule(vec![(0, vec![0.75, 0.25]), (1000, vec![0.25, 0.75])], false)
        .samples_per_epoch(4000)
        .build()
        .unwrap();
    let at = |g| m.counts_before(g, 0);
    assert_eq!(at(1000), vec![750, 250]);
    let d: Vec<u64> = at(2000).iter().zip(at(1000)).map(|(x, y)| x - y).collect();
    assert_eq!(d, vec![250, 750]);
    assert_eq!(m.weights_at(999), &[0.75, 0.25]);
    assert_eq!(m.weights_at(1000), &[0.25, 0.75]);
    let r = Mixture::builder(vec![comp("a", 0, 100), comp("b", 1, 100)])
        .schedule(vec![(0, vec![1.0, 0.0]), (6400, vec![0.0, 1.0])], true)
        .samples_per_epoch(8000)
        .build()
        .unwrap();
    assert!(r.weights_at(0)[0] > 0.99 && r.weights_at(0)[0] < 1.0);
    assert!((r.weights_at(3200)[0] - 0.5).abs() < 0.02);
    assert_eq!(r.weights_at(7000), &[0.0, 1.0]);
    // The counts are continuous across the steps.
    let total: u64 = r.counts_before(6400, 0).iter().sum();
    assert_eq!(total, 6400);
}

#[test]
fn random_mode_counts_match_a_scan() {
    let m = Mixture::builder(vec![comp("a", 0, 50), comp("b", 1, 30), comp("c", 2, 20)])
        .weights(vec![0.5, 0.3, 0.2])
        .mode(MixMode::Random)
        .samples_per_epoch(5000)
        .build()
        .unwrap();
    let mut counts = [0u64; 3];
    for g in 0..5000 {
        let (c, n) = m.locate(g, 3);
        assert_eq!(n, counts[c]);
        counts[c] += 1;
    }
    assert!(counts[0] > 2300 && counts[0] < 2700, "{counts:?}");
    let other: Vec<usize> = (0..64).map(|g| m.locate(g, 4).0).collect();
    let same: Vec<usize> = (0..64).map(|g| m.locate(g, 3).0).collect();
    assert_ne!(other, same, "the seed changes the draws");
}

#[test]
fn nested_mixtures_and_field_checks() {
    let inner = Arc::new(
        Mixture::builder(vec![comp("x", 5, 4), comp("y", 6, 4)])
            .weights(vec![0.5, 0.5])
            .build()
            .unwrap(),
    );
    let m = Mixture::builder(vec![comp("a", 0, 8), Component::mixture("xy", inner)])
        .weights(vec![0.5, 0.5])
        .source_column("source")
        .build()
        .unwrap();
    assert_eq!(m.samples_per_epoch(), 16);
    let mut tags = std::collections::BTreeSet::new();
    for g in 0..16 {
        let s = m.read(g).unwrap();
        tags.insert(value(&s) / 1_000_000);
        assert!(s.get("source").is_some());
    }
    assert_eq!(tags.into_iter().collect::<Vec<_>>(), vec![0, 5, 6]);
    let odd = FnSource::new("odd", 5, |id| {
        Ok(Sample::new(id).with("w", Field::Array(Array::scalar_i64(id as i64))))
    });
    let m = Mixture::builder(vec![comp("a", 0, 5), Component::new("odd", Arc::new(odd))])
        .weights(vec![0.5, 0.5])
        .build()
        .unwrap();
    let err = (0..4)
        .map(|g| m.read(g))
        .find_map(Result::err)
        .unwrap()
        .to_string();
    assert!(
        err.contains("\"odd\"") && err.contains("\"w\"") && err.contains("same fields"),
        "{err}"
    );
}

/// A source with a columnar path: `v` as in [`comp`], collated into an i64 tensor.
struct Columnar {
    manifest: Manifest,
    tag: u64,
}

impl Source for Columnar {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    fn read(&self, id: u64) -> Result<Sample, Error> {
        let v = (self.tag * 1_000_000 + id) as i64;
        Ok(Sample::new(id).with("v", Field::Array(Array::scalar_i64(v))))
    }
    fn collate(
        &self,
        ids: &[u64],
        _pool: &BufferPool,
    ) -> Option<Result<Vec<(String, Column)>, Error>> {
        let v: Vec<i64> = ids
            .iter()
            .map(|&i| (self.tag * 1_000_000 + i) as i64)
            .collect();
        let t = Tensor::from_slice(&v, vec![ids.len()]);
        Some(Ok(vec![("v".to_string(), Column::Tensor(t))]))
    }
}

#[test]
fn the_columnar_path_gives_the_samples_the_sample_path_gives() {
    let columnar = |tag, len| -> Arc<dyn Source> {
        Arc::new(Columnar {
            manifest: virtual_manifest("c", len),
            tag,
        })
    };
    let m = Mixture::builder(vec![
        Component::new("a", columnar(0, 13)),
        Component::new("b", columnar(1, 7)),
    ])
    .weights(vec![0.7, 0.3])
    .samples_per_epoch(60)
    .source_column("src")
    .build()
    .unwrap();
    let pool = BufferPool::new(1 << 20);
    let ids: Vec<u64> = (0..60).collect();
    let cols = m.collate(&ids, &pool).unwrap().unwrap();
    let get = |name: &str| -> Vec<i64> {
        let Some((_, Column::Tensor(t))) = cols.iter().find(|(n, _)| n == name) else {
            panic!("no {name}")
        };
        t.as_bytes()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let (v, src) = (get("v"), get("src"));
    for (i, &id) in ids.iter().enumerate() {
        let s = m.read(id).unwrap();
        assert_eq!(v[i] as u64, value(&s), "row {i}");
        assert_eq!(src[i], v[i] / 1_000_000);
    }
    assert_eq!(m.served()["a"]["samples"].as_u64().unwrap() % 42, 0);
}

#[test]
fn bad_definitions_are_refused_by_name() {
    let e = |b: MixtureBuilder| b.build().unwrap_err().to_string();
    let two = || vec![comp("a", 0, 5), comp("b", 1, 5)];
    assert!(e(Mixture::builder(two()).weights(vec![1.0])).contains("1 weights"));
    assert!(e(Mixture::builder(two()).weights(vec![1.0, -1.0])).contains("\"b\""));
    assert!(e(Mixture::builder(two()).weights(vec![0.0, 0.0])).contains("all zero"));
    assert!(
        e(Mixture::builder(two())
            .weights(vec![1.0, 1.0])
            .policy(Policy::Cycle))
        .contains("samples_per_epoch")
    );
    assert!(
        e(Mixture::builder(two()).schedule(vec![(5, vec![1.0, 1.0])], false))
            .contains("first point")
    );
    assert!(
        e(Mixture::builder(vec![comp("a", 0, 5), comp("a", 1, 5)]).weights(vec![1.0, 1.0]))
            .contains("two components")
    );
    assert!(
        e(Mixture::builder(two())
            .weights(vec![1.0, 1.0])
            .policy(Policy::StopOnAll)
            .samples_per_epoch(3))
        .contains("cycle")
    );
}
