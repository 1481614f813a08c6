//! The planner: what every rank and node of a job will read, computed from the manifest and
//! the options alone (no data read), as `chute plan` prints it.
//!
//! For each epoch and rank: samples, batches, the shards it touches and the bytes it
//! downloads; per node (ranks `node * W/K .. (node + 1) * W/K`, as torchrun numbers them):
//! the shards its ranks touch together (what a node-local cache shared by them downloads);
//! how many shards more than one rank, or more than one node, touches (downloaded twice); and
//! the samples the equal-count rule drops (`drop_last`) or repeats.
//!
//! Exactness: with block shuffle (and no shuffle on one rank) shards stream whole, and the
//! shards a rank touches are exact: a window of shards wholly inside its run is all touched;
//! a window it shares with a neighbour is looked at position by position (until every shard
//! of the window is seen). Global shuffle and strided ranks read samples by range from every
//! shard: their shards touched are exact for strided ranks and the expectation for global
//! shuffle, and their bytes are the samples' mean size times the samples.
//!
//! The cost is O(shards + ranks x the samples of the windows ranks share) per epoch, with
//! memory O(shards + ranks): 1,024 ranks over 10^9 samples in 100,000 shards take about a
//! second (BENCHMARKS.md).

use serde::Serialize;

use crate::error::ConfigError;
use crate::manifest::Manifest;
use crate::plan::{Plan, PlanConfig, Shuffle};

/// What to plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanQuery {
    /// Seed of the run.
    pub seed: u64,
    /// Ordering mode.
    pub shuffle: Shuffle,
    /// Ranks in all.
    pub world_size: u64,
    /// Nodes (machines); `world_size` must be a multiple. Default 1.
    pub nodes: u64,
    /// Samples per batch.
    pub batch_size: u64,
    /// Drop each rank's last incomplete batch (and the remainder).
    pub drop_last: bool,
    /// The first epoch planned.
    pub first_epoch: u64,
    /// Epochs planned.
    pub epochs: u64,
    /// Bytes per second each node's link gives, for the time estimate.
    pub bandwidth: Option<f64>,
    /// The training step's seconds per batch, for the time estimate.
    pub step_secs: Option<f64>,
}

impl Default for PlanQuery {
    fn default() -> Self {
        PlanQuery {
            seed: 0,
            shuffle: Shuffle::Global,
            world_size: 1,
            nodes: 1,
            batch_size: 1,
            drop_last: false,
            first_epoch: 0,
            epochs: 1,
            bandwidth: None,
            step_secs: None,
        }
    }
}

/// One rank in one epoch.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RankPlan {
    /// The rank.
    pub rank: u64,
    /// Its node.
    pub node: u64,
    /// Samples it reads (equal on every rank).
    pub samples: u64,
    /// Batches it delivers.
    pub batches: u64,
    /// Shards it reads from (an expectation under global shuffle).
    pub shards: f64,
    /// Bytes it downloads from remote storage without a shared cache: its shards whole when
    /// they stream, its samples' bytes when they are read by range.
    pub bytes: u64,
}

/// One node in one epoch.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodePlan {
    /// The node.
    pub node: u64,
    /// Its ranks, `first..first + count`.
    pub first_rank: u64,
    /// See `first_rank`.
    pub ranks: u64,
    /// Samples its ranks read.
    pub samples: u64,
    /// Shards its ranks read from, together.
    pub shards: f64,
    /// Bytes it downloads with a node-local cache its ranks share (each shard once).
    pub bytes: u64,
    /// Seconds to download them at `bandwidth`.
    pub download_secs: Option<f64>,
}

/// One epoch of the job.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EpochPlan {
    /// The epoch.
    pub epoch: u64,
    /// Per rank.
    pub ranks: Vec<RankPlan>,
    /// Per node.
    pub nodes: Vec<NodePlan>,
    /// Shards read by more than one rank (split between them: downloaded once per rank
    /// without a shared cache).
    pub shards_split_across_ranks: u64,
    /// Shards read by more than one node (downloaded by each).
    pub shards_split_across_nodes: u64,
    /// Bytes all nodes download.
    pub bytes: u64,
    /// Seconds of training steps per rank (`batches * step`).
    pub compute_secs: Option<f64>,
    /// Estimated seconds for the epoch: the slower of the steps and the slowest node's
    /// downloads (read-ahead overlaps them).
    pub epoch_secs: Option<f64>,
    /// The estimated fraction of the epoch the steps wait for data.
    pub wait_fraction: Option<f64>,
}

/// The plan of a job.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobPlan {
    /// Samples in an epoch.
    pub total_samples: u64,
    /// Shards, and their bytes.
    pub shards: u64,
    /// See `shards`.
    pub total_bytes: u64,
    /// Ranks and nodes.
    pub world_size: u64,
    /// See `world_size`.
    pub nodes: u64,
    /// The shuffle mode.
    pub shuffle: String,
    /// Whole shards stream (block, or none on one rank) rather than samples by range.
    pub streams_whole_shards: bool,
    /// Samples per rank and epoch.
    pub samples_per_rank: u64,
    /// Batches per rank and epoch.
    pub batches_per_rank: u64,
    /// Samples the equal-count rule drops per epoch (`drop_last`).
    pub dropped: u64,
    /// Samples it repeats per epoch (without `drop_last`).
    pub repeated: u64,
    /// Per epoch.
    pub epochs: Vec<EpochPlan>,
}

/// Plans `query` over `manifest`. Fails like [`Plan::new`] for options it refuses, and when
/// `world_size` is not a multiple of `nodes`.
pub fn plan_job(manifest: &Manifest, query: &PlanQuery) -> Result<JobPlan, ConfigError> {
    let w = query.world_size;
    if query.nodes == 0 || !w.is_multiple_of(query.nodes) {
        return Err(ConfigError::new(
            "nodes",
            format!(
                "{} nodes for {w} ranks: the ranks must split evenly among the nodes",
                query.nodes
            ),
        ));
    }
    let per_node = w / query.nodes;
    let total = manifest.total_samples();
    let n = manifest.shards.len();
    let total_bytes: u64 = manifest.shards.iter().map(|s| s.bytes).sum();
    let mean_sample = if total > 0 {
        total_bytes as f64 / total as f64
    } else {
        0.0
    };
    let mut epochs = Vec::with_capacity(query.epochs as usize);
    let mut summary = None;
    for epoch in query.first_epoch..query.first_epoch + query.epochs {
        let cfg = PlanConfig {
            seed: query.seed,
            epoch,
            rank: 0,
            world_size: w,
            shuffle: query.shuffle,
            batch_size: query.batch_size,
            drop_last: query.drop_last,
            start: 0,
            taken: Vec::new(),
        };
        let plan = Plan::new(manifest, &cfg)?;
        let len = plan.len();
        let streams = plan.shard_window().is_some();
        // Which ranks read each shard: the lowest and the highest rank, and the lowest and
        // highest node (a shard read by ranks r1 < r2 is split; by nodes k1 < k2, too).
        let mut seen: Vec<Option<(u64, u64)>> = vec![None; n];
        let mut node_seen: Vec<Option<(u64, u64)>> = vec![None; n];
        let mut node_shards = vec![0f64; query.nodes as usize];
        let mut node_bytes = vec![0u64; query.nodes as usize];
        let mut ranks = Vec::with_capacity(w as usize);
        // Under global shuffle every rank (and every node) has the same expectation.
        let global = matches!(query.shuffle, Shuffle::Global) && !streams && total > 0;
        let rank_expected = if global {
            expected_shards(manifest, total, len)
        } else {
            0.0
        };
        let node_expected = if global {
            expected_shards(manifest, total, len * per_node)
        } else {
            0.0
        };
        let mut mark = |shard: usize, rank: u64, bytes: &mut u64, count: &mut f64| {
            let node = rank / per_node;
            let first_for_rank = seen[shard].is_none_or(|(_, hi)| hi != rank);
            if first_for_rank {
                *bytes += manifest.shards[shard].bytes;
                *count += 1.0;
                seen[shard] = Some(seen[shard].map_or((rank, rank), |(lo, _)| (lo, rank)));
                if node_seen[shard].is_none_or(|(_, hi)| hi != node) {
                    node_shards[node as usize] += 1.0;
                    node_bytes[node as usize] += manifest.shards[shard].bytes;
                    node_seen[shard] =
                        Some(node_seen[shard].map_or((node, node), |(lo, _)| (lo, node)));
                }
            }
        };
        for r in 0..w {
            let (mut bytes, mut count) = (0u64, 0f64);
            if total > 0 && len > 0 {
                if let Some((order, prefix, window)) = plan.block_layout() {
                    let (first, count_p) = plan.rank_positions(r);
                    for (lo, hi) in wrapped(first, count_p, total) {
                        block_shards(&plan, manifest, order, prefix, window, lo, hi, &mut |s| {
                            mark(s, r, &mut bytes, &mut count)
                        });
                    }
                } else if streams {
                    // No shuffle on one rank: the shards in order, whole.
                    for s in 0..n {
                        if manifest.shards[s].samples > 0 {
                            mark(s, r, &mut bytes, &mut count);
                        }
                    }
                } else {
                    // Samples by range: strided ranks (none) or a random permutation (global).
                    bytes = (len as f64 * mean_sample).round() as u64;
                    count = if global {
                        rank_expected
                    } else {
                        strided_shards(manifest, r, w, len) as f64
                    };
                }
            }
            ranks.push(RankPlan {
                rank: r,
                node: r / per_node,
                samples: len,
                batches: len.div_ceil(query.batch_size.max(1)),
                shards: count,
                bytes,
            });
        }
        let split_ranks = seen
            .iter()
            .filter(|s| s.is_some_and(|(lo, hi)| lo != hi))
            .count() as u64;
        let split_nodes = node_seen
            .iter()
            .filter(|s| s.is_some_and(|(lo, hi)| lo != hi))
            .count() as u64;
        let nodes: Vec<NodePlan> = (0..query.nodes)
            .map(|k| {
                let rs = &ranks[(k * per_node) as usize..((k + 1) * per_node) as usize];
                let (shards, bytes) = if streams {
                    (node_shards[k as usize], node_bytes[k as usize])
                } else {
                    // Range reads: each rank its own samples' bytes; the shards the node's
                    // ranks read from together.
                    let shards = if global {
                        node_expected
                    } else {
                        rs.iter().map(|r| r.shards).sum::<f64>().min(n as f64)
                    };
                    (shards, rs.iter().map(|r| r.bytes).sum())
                };
                NodePlan {
                    node: k,
                    first_rank: k * per_node,
                    ranks: per_node,
                    samples: rs.iter().map(|r| r.samples).sum(),
                    shards,
                    bytes,
                    download_secs: query
                        .bandwidth
                        .filter(|b| *b > 0.0)
                        .map(|b| bytes as f64 / b),
                }
            })
            .collect();
        let compute = query
            .step_secs
            .map(|s| len.div_ceil(query.batch_size.max(1)) as f64 * s);
        let download = nodes
            .iter()
            .filter_map(|k| k.download_secs)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        let (epoch_secs, wait) = match (compute, download) {
            (Some(c), Some(d)) => {
                let t = c.max(d);
                (
                    Some(t),
                    Some(if t > 0.0 { (d - c).max(0.0) / t } else { 0.0 }),
                )
            }
            (Some(c), None) => (Some(c), None),
            (None, Some(d)) => (Some(d), None),
            (None, None) => (None, None),
        };
        let removed = total.abs_diff(len * w);
        summary.get_or_insert((streams, len, len.div_ceil(query.batch_size.max(1)), removed));
        epochs.push(EpochPlan {
            epoch,
            bytes: nodes.iter().map(|k| k.bytes).sum(),
            ranks,
            nodes,
            shards_split_across_ranks: split_ranks,
            shards_split_across_nodes: split_nodes,
            compute_secs: compute,
            epoch_secs,
            wait_fraction: wait,
        });
    }
    let (streams, len, batches, removed) = summary.unwrap_or((false, 0, 0, 0));
    Ok(JobPlan {
        total_samples: total,
        shards: n as u64,
        total_bytes,
        world_size: w,
        nodes: query.nodes,
        shuffle: query.shuffle.to_string(),
        streams_whole_shards: streams,
        samples_per_rank: len,
        batches_per_rank: batches,
        dropped: if query.drop_last { removed } else { 0 },
        repeated: if query.drop_last { 0 } else { removed },
        epochs,
    })
}

/// The positions `first..first + count`, taken modulo `total` (padding wraps to the start),
/// as at most two ranges.
fn wrapped(first: u64, count: u64, total: u64) -> Vec<(u64, u64)> {
    let count = count.min(total);
    let lo = first % total;
    if lo + count <= total {
        vec![(lo, lo + count)]
    } else {
        vec![(lo, total), (0, lo + count - total)]
    }
}

/// Calls `touch` with every shard the block-mode positions `lo..hi` read from: all shards of
/// each window wholly inside, and for a window only partly inside, the shards its positions
/// there map to (looked at one by one until every shard of the window is seen).
#[allow(clippy::too_many_arguments)]
fn block_shards(
    plan: &Plan,
    manifest: &Manifest,
    order: &[u32],
    prefix: &[u64],
    window: usize,
    lo: u64,
    hi: u64,
    touch: &mut dyn FnMut(usize),
) {
    if lo >= hi {
        return;
    }
    let window_of = |p: u64| (prefix.partition_point(|&x| x <= p) - 1) / window;
    let (w0, w1) = (window_of(lo), window_of(hi - 1));
    for w in w0..=w1 {
        let first = w * window;
        let last = (first + window).min(order.len());
        let (span_lo, span_hi) = (prefix[first], prefix[last]);
        let empty = |j: usize| prefix[j + 1] == prefix[j];
        if lo <= span_lo && span_hi <= hi {
            (first..last)
                .filter(|&j| !empty(j))
                .for_each(|j| touch(order[j] as usize));
            continue;
        }
        let mut left: Vec<usize> = (first..last)
            .filter(|&j| !empty(j))
            .map(|j| order[j] as usize)
            .collect();
        for p in lo.max(span_lo)..hi.min(span_hi) {
            if left.is_empty() {
                break;
            }
            if let Some((s, _)) = manifest.locate(plan.order_at(p))
                && let Some(k) = left.iter().position(|&x| x == s)
            {
                touch(left.swap_remove(k));
            }
        }
    }
}

/// Shards holding one of rank `r`'s positions `r, r + w, ...` (`len` of them, wrapping).
fn strided_shards(manifest: &Manifest, r: u64, w: u64, len: u64) -> u64 {
    let total = manifest.total_samples();
    let mut touched = vec![false; manifest.shards.len()];
    let mut count = 0;
    for (i, s) in manifest.shards.iter().enumerate() {
        let start = manifest.shard_start(i);
        // The rank's positions inside [start, start + samples), before any wrap.
        let first = start + (r + w - start % w) % w;
        let covered = first < start + s.samples && (first - r) / w < len;
        if covered && !touched[i] {
            touched[i] = true;
            count += 1;
        }
    }
    // Padding positions past the end wrap to the start: positions r + k*w >= total.
    let last = r + (len.saturating_sub(1)) * w;
    if len > 0 && last >= total {
        // Fewer than `w` of them: from the first index whose position is past the end.
        for i in (total.saturating_sub(r)).div_ceil(w)..len {
            let p = r + i * w;
            if p >= total
                && let Some((s, _)) = manifest.locate(p % total)
                && !touched[s]
            {
                touched[s] = true;
                count += 1;
            }
        }
    }
    count
}

/// The expected number of shards `len` distinct uniformly random positions of `total` touch.
fn expected_shards(manifest: &Manifest, total: u64, len: u64) -> f64 {
    let f = len.min(total) as f64 / total as f64;
    manifest
        .shards
        .iter()
        .filter(|s| s.samples > 0)
        .map(|s| 1.0 - (1.0 - f).powf(s.samples as f64))
        .sum()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn manifest(counts: &[u64]) -> Manifest {
        crate::testing::manifest_sized(counts, |i, n| 1000 + 7 * i as u64 + 10 * n)
    }

    /// The shards each rank's ids fall in, read off the plan sample by sample.
    fn truth(m: &Manifest, q: &PlanQuery, epoch: u64) -> Vec<BTreeSet<usize>> {
        (0..q.world_size)
            .map(|rank| {
                let cfg = PlanConfig {
                    seed: q.seed,
                    epoch,
                    rank,
                    world_size: q.world_size,
                    shuffle: q.shuffle,
                    batch_size: q.batch_size,
                    drop_last: q.drop_last,
                    start: 0,
                    taken: Vec::new(),
                };
                let plan = Plan::new(m, &cfg).unwrap();
                plan.iter().map(|id| m.locate(id).unwrap().0).collect()
            })
            .collect()
    }

    #[test]
    fn figures_equal_what_each_rank_reads() {
        let m = manifest(&[13, 40, 0, 7, 25, 31, 2, 19, 60, 11, 8, 33]);
        for shuffle in [
            Shuffle::None,
            Shuffle::Global,
            Shuffle::Block { window: 1 },
            Shuffle::Block { window: 3 },
        ] {
            for (w, nodes) in [(1, 1), (2, 1), (3, 3), (4, 2), (6, 2), (7, 1)] {
                for drop_last in [false, true] {
                    let q = PlanQuery {
                        seed: 5,
                        shuffle,
                        world_size: w,
                        nodes,
                        batch_size: 4,
                        drop_last,
                        first_epoch: 2,
                        epochs: 2,
                        ..Default::default()
                    };
                    let job = plan_job(&m, &q).unwrap();
                    let what = format!("{shuffle} w={w} nodes={nodes} drop_last={drop_last}");
                    let total = m.total_samples();
                    assert_eq!(total + job.repeated, job.samples_per_rank * w + job.dropped);
                    for e in &job.epochs {
                        let sets = truth(&m, &q, e.epoch);
                        for (r, set) in e.ranks.iter().zip(&sets) {
                            let cfg_len = job.samples_per_rank;
                            assert_eq!(r.samples, cfg_len, "{what}");
                            if shuffle == Shuffle::Global {
                                continue; // an expectation, checked below
                            }
                            assert_eq!(r.shards, set.len() as f64, "{what} rank {}", r.rank);
                            if job.streams_whole_shards {
                                let bytes: u64 = set.iter().map(|&s| m.shards[s].bytes).sum();
                                assert_eq!(r.bytes, bytes, "{what} rank {}", r.rank);
                            }
                        }
                        if job.streams_whole_shards {
                            let split = (0..m.shards.len())
                                .filter(|s| sets.iter().filter(|set| set.contains(s)).count() > 1)
                                .count() as u64;
                            assert_eq!(e.shards_split_across_ranks, split, "{what}");
                            let per = (w / nodes) as usize;
                            for k in &e.nodes {
                                let union: BTreeSet<usize> = sets
                                    [k.node as usize * per..(k.node as usize + 1) * per]
                                    .iter()
                                    .flatten()
                                    .copied()
                                    .collect();
                                let bytes: u64 = union.iter().map(|&s| m.shards[s].bytes).sum();
                                assert_eq!(
                                    (k.shards, k.bytes),
                                    (union.len() as f64, bytes),
                                    "{what}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn global_shuffle_touches_about_the_expected_shards() {
        let m = manifest(&[50; 40]);
        let q = PlanQuery {
            shuffle: Shuffle::Global,
            world_size: 8,
            batch_size: 10,
            ..Default::default()
        };
        let job = plan_job(&m, &q).unwrap();
        let sets = truth(&m, &q, 0);
        for (r, set) in job.epochs[0].ranks.iter().zip(&sets) {
            assert!(
                (r.shards - set.len() as f64).abs() <= 4.0,
                "{r:?} vs {}",
                set.len()
            );
            let bytes: u64 = m.shards.iter().map(|s| s.bytes).sum();
            assert!(
                r.bytes.abs_diff((250.0 * bytes as f64 / 2000.0) as u64) <= 1,
                "{r:?}"
            );
        }
    }

    #[test]
    fn estimates_follow_the_slower_of_steps_and_downloads() {
        let m = manifest(&[100; 8]);
        let q = PlanQuery {
            shuffle: Shuffle::Block { window: 1 },
            world_size: 4,
            nodes: 2,
            batch_size: 10,
            bandwidth: Some(1000.0),
            step_secs: Some(0.01),
            ..Default::default()
        };
        let job = plan_job(&m, &q).unwrap();
        let e = &job.epochs[0];
        // Each node reads 4 shards of 2,007..2,056 bytes at 1,000 B/s: about 8 s; steps: 0.2 s.
        let slowest = e
            .nodes
            .iter()
            .map(|k| k.download_secs.unwrap())
            .fold(0.0, f64::max);
        assert_eq!(e.epoch_secs, Some(slowest));
        assert!((e.wait_fraction.unwrap() - (slowest - 0.2) / slowest).abs() < 1e-9);
        assert_eq!(e.compute_secs, Some(0.2));
        assert!(plan_job(&m, &PlanQuery { nodes: 3, ..q }).is_err());
    }

    #[test]
    fn a_thousand_ranks_over_a_hundred_million_samples() {
        // 10^4 shards of 10^4 samples, 1,024 ranks on 128 nodes (a debug-build smoke test;
        // the 10^9-sample figure is in BENCHMARKS.md).
        let m = manifest(&[10_000; 10_000]);
        let q = PlanQuery {
            shuffle: Shuffle::block(),
            world_size: 1024,
            nodes: 128,
            batch_size: 32,
            ..Default::default()
        };
        let job = plan_job(&m, &q).unwrap();
        let e = &job.epochs[0];
        assert_eq!(e.ranks.len(), 1024);
        let shards: f64 = e.nodes.iter().map(|k| k.shards).sum();
        assert!(
            (10_000.0..=10_000.0 + 2.0 * 4.0 * 128.0).contains(&shards),
            "{shards}"
        );
        assert!(e.shards_split_across_nodes <= 2 * 4 * 128);
    }
}
