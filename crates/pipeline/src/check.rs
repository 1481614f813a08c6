//! Reusable conformance checks for loaders, sources and transforms.
//!
//! - [`check_resume`]: restores from the state before *every* batch of a run spanning epoch
//!   boundaries and compares the rest of the stream with the uninterrupted run.
//! - [`check_matrix`]: the delivered stream must be byte-for-byte identical for every worker
//!   count and prefetch depth.
//!
//! Compiled with the `testing` feature (and in this crate's own tests): they are tools for
//! tests of sources and transforms, not part of the loader's API.

use chute_core::Error;

use crate::{Loader, batch_digest};

/// What a check records of each delivered batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// Epoch of the batch.
    pub epoch: u64,
    /// Global ids of its rows.
    pub ids: Vec<u64>,
    /// Digest of its contents.
    pub digest: String,
}

/// Runs `loader` until it has finished epoch `last_epoch`, recording each batch and the
/// state taken just before it.
pub fn run_to_end(
    loader: &mut Loader,
    last_epoch: u64,
) -> Result<Vec<(chute_core::State, Delivered)>, Error> {
    let mut out = Vec::new();
    while loader.epoch() <= last_epoch {
        let before = loader.state();
        match loader.next() {
            Some(batch) => {
                let batch = batch?;
                out.push((
                    before,
                    Delivered {
                        epoch: batch.epoch,
                        ids: batch.ids.clone(),
                        digest: batch_digest(&batch),
                    },
                ));
            }
            None => continue,
        }
    }
    Ok(out)
}

/// Restores a fresh loader from the state before every batch of the run that `make` builds
/// (through `epochs` epochs) and checks that the rest of the stream is identical to the
/// uninterrupted run. Also checks that the state after the last batch of an epoch resumes at
/// the first batch of the next.
pub fn check_resume(make: impl Fn() -> Loader, epochs: u64) -> Result<(), String> {
    let mut reference_loader = make();
    let last_epoch = reference_loader.epoch() + epochs - 1;
    let reference =
        run_to_end(&mut reference_loader, last_epoch).map_err(|e| format!("reference: {e}"))?;
    if reference.is_empty() {
        return Err("the reference run delivered no batches".into());
    }
    for (k, (state, _)) in reference.iter().enumerate() {
        let mut resumed = make();
        resumed
            .restore(state)
            .map_err(|e| format!("restore before batch {k}: {e}"))?;
        let rest: Vec<Delivered> = run_to_end(&mut resumed, last_epoch)
            .map_err(|e| format!("resumed before batch {k}: {e}"))?
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        let want: Vec<&Delivered> = reference[k..].iter().map(|(_, d)| d).collect();
        if rest.len() != want.len() {
            return Err(format!(
                "resumed before batch {k} ({state:?}): {} batches, the uninterrupted run had {}",
                rest.len(),
                want.len()
            ));
        }
        if let Some(i) = (0..rest.len()).find(|&i| &rest[i] != want[i]) {
            return Err(format!(
                "resumed before batch {k}: batch {} differs: {:?} vs {:?}",
                k + i,
                rest[i],
                want[i]
            ));
        }
    }
    // The state after an epoch's last batch is the start of the next epoch.
    for w in reference.windows(2) {
        if w[1].1.epoch != w[0].1.epoch {
            let s = &w[1].0;
            if (s.epoch, s.delivered, s.start) != (w[1].1.epoch, 0, 0) {
                return Err(format!("state after the last batch of an epoch is {s:?}"));
            }
        }
    }
    Ok(())
}

/// Builds the loader for every `(num_workers, prefetch)` in `workers x prefetch` with `make`
/// and checks that all deliver the same stream (ids and contents) through `epochs` epochs.
pub fn check_matrix(
    make: impl Fn(usize, usize) -> Loader,
    workers: &[usize],
    prefetch: &[usize],
    epochs: u64,
) -> Result<(), String> {
    let mut reference: Option<(usize, usize, Vec<Delivered>)> = None;
    for &w in workers {
        for &p in prefetch {
            let mut loader = make(w, p);
            let last = loader.epoch() + epochs - 1;
            let got: Vec<Delivered> = run_to_end(&mut loader, last)
                .map_err(|e| format!("workers={w} prefetch={p}: {e}"))?
                .into_iter()
                .map(|(_, d)| d)
                .collect();
            match &reference {
                None => reference = Some((w, p, got)),
                Some((rw, rp, want)) => {
                    if &got != want {
                        let i = got.iter().zip(want).position(|(a, b)| a != b);
                        return Err(format!(
                            "workers={w} prefetch={p} differs from workers={rw} prefetch={rp} \
                             (first differing batch: {i:?}; {} vs {} batches)",
                            got.len(),
                            want.len()
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
