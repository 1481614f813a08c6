//! [`Mixture`]: weighted mixtures of sources, as one source.
//!
//! The mixture is an endless stream of positions `G = 0, 1, 2, ...` (across its epochs). Each
//! position belongs to one component, and is that component's `k`-th draw, where `k` counts
//! the component's earlier positions; the draw is sample `k % len` of the component's epoch
//! `k / len`, in that epoch's order (the component's own shuffle and seed). So components run
//! through their epochs independently, reshuffled each time, and every figure is a pure
//! function of `G`: the state of a mixed run stays a position.
//!
//! - **`stratified`** (the default): the weights in effect are quantized to [`QUANTUM`]
//!   parts. With the loader's batches of `B` (`B > 1`), each batch of an epoch holds each
//!   component's share `w B` rounded down or up, and the components that get one more are
//!   chosen by earliest deadline first over a period of [`QUANTUM`] batches, so every run of
//!   batches from the start of a schedule segment keeps each count within one of its share
//!   ("rounded with carry"); inside a batch its samples are interleaved the same way. With
//!   `B = 1` (and inside nested mixtures) the same holds position by position. (Within one
//!   over *every* window, not only runs from a segment's start, is impossible in general for
//!   three or more components: Fraenkel's balanced words.)
//! - **`random`**: each position draws its component i.i.d. by weight from the seeded RNG
//!   (tf.data's `sample_from_datasets`); counts are memoized every [`RANDOM_CHUNK`] positions.
//!
//! Weights may change with the position ([`Mixture::schedule`]: piecewise constant, or linear
//! ramps resolved into steps). The mixture's epoch length is stated up front: given, or where
//! the first (`stop_on_first`) or the last (`stop_on_all`) component finishes its first epoch.
//!
//! Ranks: the engine hands a rank the epoch positions `i * W + r` (its strided split). The
//! mixture reads those as "rank `r`'s `i`-th sample" and serves it position
//! `(i / B) * B * W + r * B + i % B` of the stream: each rank's batch is a run of `B`
//! consecutive positions, so its proportions hold on every rank, the ranks' batches are
//! disjoint and together are the single-rank stream, and the split is the same for any world
//! size from a position on (elastic resume).

mod builder;
pub mod file;
mod mode;
mod schedule;
mod source;
#[cfg(test)]
mod tests;

pub use builder::MixtureBuilder;
pub use mode::{MIXTURE_FORMAT, MixMode, Policy};
pub use schedule::{
    MAX_COMPONENTS, MAX_RANDOM_POSITION, MAX_SCHEDULE_EPOCHS, MAX_SEGMENT_WORK, MAX_SEGMENTS,
    QUANTUM, RANDOM_CHUNK,
};
pub use source::{Component, Mixture, part_fingerprints};
