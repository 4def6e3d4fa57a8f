//! Weighted mixtures of several sources, sampled step by step.
//!
//! A [`MixtureSampler`] fills each slot of a global batch with a pair
//! `(source, record)`. Like [`Sampler`], batch `step` is a pure function of
//! the constructor arguments and `step`, so seeking is O(1) and a resumed or
//! resharded run sees the same batches.
//!
//! Every source `k` has its own index stream: the position stream of a
//! [`Sampler`] over its `length_k` records with the loader's mode (see
//! "Position streams" in [`crate::sampler`]), seeded with
//! `derive(derive(seed, DOMAIN_SOURCE), k)`. What differs between the two
//! [`Proportions`] is which positions of that stream a step consumes.
//!
//! # Stream definitions
//!
//! Weights are normalised to `w_k = weight_k / sum(weights)`. The
//! *largest-remainder apportionment* of `T` seats gives source `k`
//! `floor(w_k * T)` seats, then hands the seats left over one each to the
//! sources with the largest fractional parts `w_k * T - floor(w_k * T)`,
//! ties going to the lower source number (all in IEEE double arithmetic).
//!
//! * [`Proportions::Exact`]: source `k` gets the same quota `q_k` of every
//!   batch, the apportionment of `batch_size` seats (a source whose quota
//!   would be 0 is refused). With `c_k = q_0 + ... + q_(k-1)`, the values
//!   `c_k..c_k + q_k` belong to source `k`. Slot `j` of step `s` takes value
//!   `v = π_s(j)`, where `π_s` is batch `s` of a cyclic [`Sampler`] over
//!   `batch_size` indices with batch size `batch_size` and seed
//!   `derive(seed, DOMAIN_SLOTS)` (a fresh random permutation of the
//!   slots each step). The slot is filled from source `k` with
//!   `c_k <= v < c_k + q_k`, with the record at position
//!   `s * q_k + (v - c_k)` of the source's stream. Source `k` therefore
//!   consumes exactly `q_k` consecutive positions per step, and after `s`
//!   steps has used positions `0..s * q_k`: in cyclic mode it walks through
//!   all its records once per `length_k / q_k` steps (its own epochs, one
//!   per cycle of its position stream), whatever the other sources do.
//! * [`Proportions::Iid`]: slot `j` of step `s` picks its source
//!   independently: `u`, element `j` of batch `s` of an IID [`Sampler`]
//!   over `2^32` values with seed `derive(seed, DOMAIN_PICK)`, falls in the
//!   range of source `k`, the `k`-th run of the apportionment of `2^32`
//!   seats (a source with no seat is refused as having too small a weight).
//!   The record is position `s * batch_size + j` of the source's stream.
//!   A source's positions are thus a random thinning of its stream: cyclic
//!   mode never repeats a record within one of the source's cycles, but a
//!   cycle's records are each used with probability `w_k`, so a source is
//!   covered evenly only on average. Use [`Proportions::Exact`] when each
//!   source must be walked through completely.
//!
//! ```
//! use loaderx::mixture::{MixtureSampler, Proportions};
//! use loaderx::sampler::Mode;
//!
//! // Three sources of 100, 50 and 10 records, weighted 5:3:2.
//! let m = MixtureSampler::new(&[100, 50, 10], &[5.0, 3.0, 2.0], 10, Mode::Cyclic,
//!                             Proportions::Exact, 7).unwrap();
//! assert_eq!(m.quotas(), Some(&[5u64, 3, 2][..]));
//! let (sources, records) = m.batch_at(3);
//! for k in 0..3u32 {
//!     assert_eq!(sources.iter().filter(|&&s| s == k).count(), [5, 3, 2][k as usize]);
//! }
//! assert!(sources.iter().zip(&records).all(|(&s, &r)| r < [100, 50, 10][s as usize]));
//! // Pure function of the step: asking again gives the same batch.
//! assert_eq!(m.batch_at(3), (sources, records));
//! ```

use thiserror::Error;

use crate::sampler::{derive, Mode, Sampler, SamplerError};

/// Most sources a mixture may have; per-step bookkeeping is proportional to
/// the number of sources, so it is bounded.
pub const MAX_SOURCES: usize = 1 << 16;

/// Domain-separation constants of the mixture's random streams.
const DOMAIN_SOURCE: u64 = 0x6d69_785f_736f_7572; // "mix_sour"
const DOMAIN_SLOTS: u64 = 0x6d69_785f_736c_6f74; // "mix_slot"
const DOMAIN_PICK: u64 = 0x6d69_785f_7069_636b; // "mix_pick"

/// How the slots of a batch are shared between the sources of a mixture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proportions {
    /// Every batch holds each source's largest-remainder quota, placed at
    /// random slots.
    Exact,
    /// Every slot draws its source independently, by weight.
    Iid,
}

impl Proportions {
    /// Lower-case name: `"exact"` or `"iid"`.
    pub fn name(self) -> &'static str {
        match self {
            Proportions::Exact => "exact",
            Proportions::Iid => "iid",
        }
    }
}

/// Why a [`MixtureSampler`] could not be built.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum MixtureError {
    /// No sources, or lengths and weights of different counts.
    #[error("a mixture needs at least one source and one weight per source (got {lengths} lengths and {weights} weights)")]
    Sources {
        /// Number of lengths given.
        lengths: usize,
        /// Number of weights given.
        weights: usize,
    },
    /// More than [`MAX_SOURCES`] sources.
    #[error("a mixture may have at most {MAX_SOURCES} sources, got {0}")]
    TooManySources(usize),
    /// A weight that is not a positive finite number.
    #[error("the weight of source {index} must be a positive finite number, got {weight}")]
    BadWeight {
        /// The source's number.
        index: usize,
        /// The weight given.
        weight: f64,
    },
    /// The weights add up to infinity.
    #[error("the weights add up to more than the largest finite number")]
    WeightsOverflow,
    /// In exact proportions, a source whose quota rounds to 0 slots.
    #[error("source {index} would get no slot of a batch of {batch_size} (its share is {share}); use a larger batch or iid proportions")]
    NoSlot {
        /// The source's number.
        index: usize,
        /// The global batch size.
        batch_size: u64,
        /// The source's normalised weight.
        share: f64,
    },
    /// In IID proportions, a source whose share is below 2^-32.
    #[error(
        "the weight of source {index} is too small next to the others (share {share}, below 2^-32)"
    )]
    WeightTooSmall {
        /// The source's number.
        index: usize,
        /// The source's normalised weight.
        share: f64,
    },
    /// A source's stream could not be set up (an empty source, say).
    #[error("source {index}: {error}")]
    Source {
        /// The source's number.
        index: usize,
        /// What was wrong.
        error: SamplerError,
    },
    /// The batch itself is invalid (zero or too large).
    #[error("{0}")]
    Batch(SamplerError),
}

/// Largest-remainder apportionment of `total` seats by `shares` (positive,
/// summing to about 1): floors first, then one seat each to the largest
/// fractional parts, ties to the lower index.
pub(crate) fn apportion(shares: &[f64], total: u64) -> Vec<u64> {
    let raw: Vec<f64> = shares.iter().map(|&w| w * total as f64).collect();
    // `as u64` saturates, and floors of shares summing to 1 stay below total.
    let mut seats: Vec<u64> = raw.iter().map(|r| r.floor() as u64).collect();
    let mut sum: u128 = seats.iter().map(|&s| u128::from(s)).sum();
    // Rounding in the normalisation can leave the floors a seat or so over
    // the total: take such seats back from the largest holders.
    while sum > u128::from(total) {
        if let Some(k) = (0..seats.len()).max_by_key(|&k| (seats[k], std::cmp::Reverse(k))) {
            seats[k] -= 1;
        }
        sum -= 1;
    }
    let mut left = total - sum as u64;
    let k_count = seats.len() as u64;
    if left >= k_count && k_count > 0 {
        // Only reachable through rounding slop; keeps the loop below short.
        let each = left / k_count;
        seats.iter_mut().for_each(|s| *s += each);
        left %= k_count;
    }
    let mut order: Vec<usize> = (0..seats.len()).collect();
    let frac = |k: usize| raw[k] - raw[k].floor();
    order.sort_by(|&a, &b| frac(b).total_cmp(&frac(a)).then(a.cmp(&b)));
    for &k in order.iter().take(left as usize) {
        seats[k] += 1;
    }
    seats
}

/// Checks and normalises mixture weights.
pub(crate) fn normalise(weights: &[f64]) -> Result<Vec<f64>, MixtureError> {
    for (source, &weight) in weights.iter().enumerate() {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(MixtureError::BadWeight {
                index: source,
                weight,
            });
        }
    }
    let sum: f64 = weights.iter().sum();
    if !sum.is_finite() {
        return Err(MixtureError::WeightsOverflow);
    }
    Ok(weights.iter().map(|w| w / sum).collect())
}

/// How one step's slots are dealt to the sources.
#[derive(Clone, Debug)]
enum Deal {
    Exact {
        quotas: Vec<u64>,
        /// `starts[k] = q_0 + ... + q_(k-1)`, with `starts[K] = batch_size`.
        starts: Vec<u64>,
        slots: Sampler,
    },
    Iid {
        /// Exclusive upper ends of the sources' ranges in `0..2^32`.
        upper: Vec<u64>,
        picks: Sampler,
    },
}

/// Writes into `out[i]` the number of the ascending `bounds` that are at
/// most `values[i]`, as `bounds.partition_point(|&b| b <= values[i])` would.
/// Sources are picked at random, so a search would mispredict its branches
/// half of the time; against the few bounds of a small mixture, one
/// vectorised pass over the values per bound counts them without a branch.
fn rank_into(bounds: &[u64], values: &[u64], out: &mut [u32]) {
    if bounds.len() <= 16 {
        out.fill(0);
        for &b in bounds {
            for (o, &v) in out.iter_mut().zip(values) {
                *o += u32::from(b <= v);
            }
        }
    } else {
        for (o, &v) in out.iter_mut().zip(values) {
            *o = bounds.partition_point(|&b| b <= v) as u32;
        }
    }
}

/// A stateless, seekable sampler of `(source, record)` batches over a
/// weighted mixture of sources. See the [module docs](self) for the rules.
#[derive(Clone, Debug)]
pub struct MixtureSampler {
    lengths: Vec<u64>,
    shares: Vec<f64>,
    batch_size: u64,
    batch_len: usize,
    mode: Mode,
    proportions: Proportions,
    seed: u64,
    streams: Vec<Sampler>,
    deal: Deal,
}

impl MixtureSampler {
    /// A mixture of sources with `lengths[k]` records and weight
    /// `weights[k]` each, drawing global batches of `batch_size` slots.
    ///
    /// Refuses an empty mixture, more than [`MAX_SOURCES`] sources, weights
    /// that are not positive and finite, empty sources, a zero or too large
    /// batch, and sources the proportions cannot serve (see
    /// [`MixtureError`]).
    pub fn new(
        lengths: &[u64],
        weights: &[f64],
        batch_size: u64,
        mode: Mode,
        proportions: Proportions,
        seed: u64,
    ) -> Result<MixtureSampler, MixtureError> {
        if lengths.is_empty() || lengths.len() != weights.len() {
            return Err(MixtureError::Sources {
                lengths: lengths.len(),
                weights: weights.len(),
            });
        }
        if lengths.len() > MAX_SOURCES {
            return Err(MixtureError::TooManySources(lengths.len()));
        }
        let shares = normalise(weights)?;
        // The slot sampler checks the batch (zero, too large) for us.
        let slots = Sampler::new(
            batch_size.max(1),
            batch_size,
            Mode::Cyclic,
            derive(seed, DOMAIN_SLOTS),
        )
        .map_err(MixtureError::Batch)?;
        let batch_len = slots.batch_len();
        let base = derive(seed, DOMAIN_SOURCE);
        let streams = lengths
            .iter()
            .enumerate()
            .map(|(source, &len)| {
                Sampler::new(len, 1, mode, derive(base, source as u64)).map_err(|error| {
                    MixtureError::Source {
                        index: source,
                        error,
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let deal = match proportions {
            Proportions::Exact => {
                let quotas = apportion(&shares, batch_size);
                if let Some(source) = quotas.iter().position(|&q| q == 0) {
                    return Err(MixtureError::NoSlot {
                        index: source,
                        batch_size,
                        share: shares[source],
                    });
                }
                let mut starts = Vec::with_capacity(quotas.len() + 1);
                starts.push(0);
                for &q in &quotas {
                    starts.push(starts.last().copied().unwrap_or(0) + q);
                }
                Deal::Exact {
                    quotas,
                    starts,
                    slots,
                }
            }
            Proportions::Iid => {
                let seats = apportion(&shares, 1 << 32);
                if let Some(source) = seats.iter().position(|&q| q == 0) {
                    return Err(MixtureError::WeightTooSmall {
                        index: source,
                        share: shares[source],
                    });
                }
                let upper = seats
                    .iter()
                    .scan(0u64, |acc, &s| {
                        *acc += s;
                        Some(*acc)
                    })
                    .collect();
                let picks = Sampler::new(1 << 32, batch_size, Mode::Iid, derive(seed, DOMAIN_PICK))
                    .map_err(MixtureError::Batch)?;
                Deal::Iid { upper, picks }
            }
        };
        Ok(MixtureSampler {
            lengths: lengths.to_vec(),
            shares,
            batch_size,
            batch_len,
            mode,
            proportions,
            seed,
            streams,
            deal,
        })
    }

    /// Number of sources.
    pub fn sources(&self) -> usize {
        self.lengths.len()
    }

    /// Records in each source.
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// The normalised weights (summing to 1, up to rounding).
    pub fn shares(&self) -> &[f64] {
        &self.shares
    }

    /// Slots per global batch (the batch size).
    pub fn batch_len(&self) -> usize {
        self.batch_len
    }

    /// The global batch size.
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// The sources' index order.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How slots are shared between sources.
    pub fn proportions(&self) -> Proportions {
        self.proportions
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Slots per batch of each source in [`Proportions::Exact`]; `None` in
    /// [`Proportions::Iid`].
    pub fn quotas(&self) -> Option<&[u64]> {
        match &self.deal {
            Deal::Exact { quotas, .. } => Some(quotas),
            Deal::Iid { .. } => None,
        }
    }

    /// Writes batch `step`: `sources[j]` and `records[j]` are the source
    /// number and the record (an index into that source) of slot `j`. A
    /// pure function of the sampler's parameters and `step`.
    ///
    /// # Panics
    ///
    /// If either buffer's length is not [`batch_len`](Self::batch_len).
    pub fn fill(&self, step: u64, sources: &mut [u32], records: &mut [u64]) {
        assert!(
            sources.len() == self.batch_len && records.len() == self.batch_len,
            "output buffers hold {} and {} slots but a batch has {}",
            sources.len(),
            records.len(),
            self.batch_len
        );
        match &self.deal {
            Deal::Exact {
                quotas,
                starts,
                slots,
            } => {
                // Each source's run of positions for this step, laid out
                // back to back so that value v of the slot permutation
                // addresses its record directly.
                let mut runs = vec![0u64; self.batch_len];
                for (k, stream) in self.streams.iter().enumerate() {
                    let run = &mut runs[starts[k] as usize..starts[k + 1] as usize];
                    stream.fill_positions(u128::from(step) * u128::from(quotas[k]), run);
                }
                slots.fill(step, records);
                // Value v belongs to the source k with starts[k] <= v <
                // starts[k + 1]; starts[0] = 0 and starts[K] = batch_size
                // hold for every value, so only the inner bounds are compared.
                rank_into(&starts[1..starts.len() - 1], records, sources);
                for r in records.iter_mut() {
                    *r = runs[*r as usize];
                }
            }
            Deal::Iid { upper, picks } => {
                picks.fill(step, records);
                // u belongs to the source k with upper[k - 1] <= u <
                // upper[k]; the last bound, 2^32, is above every u.
                rank_into(&upper[..upper.len() - 1], records, sources);
                // Counting sort of the slots by source, ascending within each
                // source: ends[k] is first the start of source k's run in
                // `order`, then (once every slot is placed) its end.
                let mut ends = vec![0usize; self.streams.len()];
                if ends.len() <= 16 {
                    // A vectorised pass per source beats incrementing
                    // counters in memory, one dependent on the last.
                    for (k, e) in (0u32..).zip(ends.iter_mut()) {
                        *e = sources.iter().filter(|&&s| s == k).count();
                    }
                } else {
                    for &k in sources.iter() {
                        ends[k as usize] += 1;
                    }
                }
                let mut sum = 0;
                for e in ends.iter_mut() {
                    (*e, sum) = (sum, sum + *e);
                }
                let mut scratch = vec![0u64; 2 * self.batch_len];
                let (order, values) = scratch.split_at_mut(self.batch_len);
                for (j, &k) in (0u64..).zip(sources.iter()) {
                    let e = &mut ends[k as usize];
                    order[*e] = j;
                    *e += 1;
                }
                // Each source reads its slots' positions of its stream in one
                // call, a cycle of the stream at a time.
                let first = u128::from(step) * u128::from(self.batch_size);
                let mut begin = 0;
                for (stream, &end) in self.streams.iter().zip(&ends) {
                    if end > begin {
                        let range = begin..end;
                        stream.fill_positions_at(first, &order[range.clone()], &mut values[range]);
                    }
                    begin = end;
                }
                for (&j, &v) in order.iter().zip(values.iter()) {
                    records[j as usize] = v;
                }
            }
        }
    }

    /// Batch `step` as new `(sources, records)` vectors.
    pub fn batch_at(&self, step: u64) -> (Vec<u32>, Vec<u64>) {
        let mut sources = vec![0u32; self.batch_len];
        let mut records = vec![0u64; self.batch_len];
        self.fill(step, &mut sources, &mut records);
        (sources, records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn counts(sources: &[u32], k: usize) -> Vec<usize> {
        let mut c = vec![0; k];
        for &s in sources {
            c[s as usize] += 1;
        }
        c
    }

    #[test]
    fn apportion_by_largest_remainder() {
        assert_eq!(apportion(&[0.7, 0.3], 8), [6, 2]);
        assert_eq!(apportion(&[0.7, 0.3], 10), [7, 3]);
        // Equal remainders: the lower source number wins.
        let third = 1.0 / 3.0;
        assert_eq!(apportion(&[third; 3], 10), [4, 3, 3]);
        assert_eq!(apportion(&[third; 3], 11), [4, 4, 3]);
        // 1.5, 0.75, 0.75: floors 1, 0, 0, then the two largest remainders.
        assert_eq!(apportion(&[0.5, 0.25, 0.25], 3), [1, 1, 1]);
        assert_eq!(apportion(&[0.5, 0.25, 0.25], 1), [1, 0, 0]);
        assert_eq!(apportion(&[1.0], 1 << 40), [1 << 40]);
        let w = normalise(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
        for total in [1u64, 7, 100, 1 << 32, (1 << 40) + 3] {
            assert_eq!(apportion(&w, total).iter().sum::<u64>(), total);
        }
    }

    #[test]
    fn bad_mixtures_are_refused() {
        let new = |lengths: &[u64], weights: &[f64], bs: u64, p: Proportions| {
            MixtureSampler::new(lengths, weights, bs, Mode::Cyclic, p, 1).unwrap_err()
        };
        let exact = Proportions::Exact;
        assert_eq!(
            new(&[], &[], 4, exact),
            MixtureError::Sources {
                lengths: 0,
                weights: 0
            }
        );
        assert!(matches!(
            new(&[5, 5], &[1.0], 4, exact),
            MixtureError::Sources { .. }
        ));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                new(&[5, 5], &[1.0, bad], 4, exact),
                MixtureError::BadWeight { index: 1, .. }
            ));
        }
        assert_eq!(
            new(&[5, 5], &[f64::MAX, f64::MAX], 4, exact),
            MixtureError::WeightsOverflow
        );
        assert!(matches!(
            new(&[5, 5, 5], &[0.9, 0.05, 0.05], 10, exact),
            MixtureError::NoSlot {
                index: 2,
                batch_size: 10,
                ..
            }
        ));
        // IID proportions serve that mixture, but not a weight below 2^-32.
        assert!(MixtureSampler::new(
            &[5, 5, 5],
            &[0.9, 0.05, 0.05],
            10,
            Mode::Cyclic,
            Proportions::Iid,
            1
        )
        .is_ok());
        assert!(matches!(
            new(&[5, 5], &[1.0, 1e-12], 10, Proportions::Iid),
            MixtureError::WeightTooSmall { index: 1, .. }
        ));
        assert!(matches!(
            new(&[5, 0], &[1.0, 1.0], 4, exact),
            MixtureError::Source { index: 1, .. }
        ));
        assert!(matches!(
            new(&[5, 5], &[1.0, 1.0], 0, exact),
            MixtureError::Batch(SamplerError::ZeroBatchSize)
        ));
        assert!(matches!(
            new(&[5, 5], &[1.0, 1.0], u64::MAX, Proportions::Iid),
            MixtureError::Batch(SamplerError::BatchTooLarge(_))
        ));
        let too_many = vec![1u64; MAX_SOURCES + 1];
        assert_eq!(
            new(&too_many, &vec![1.0; MAX_SOURCES + 1], 4, exact),
            MixtureError::TooManySources(MAX_SOURCES + 1)
        );
    }

    #[test]
    fn exact_quotas_in_every_batch_at_random_slots() {
        let m = MixtureSampler::new(
            &[35, 13, 8],
            &[5.0, 3.0, 2.0],
            10,
            Mode::Cyclic,
            Proportions::Exact,
            4,
        )
        .unwrap();
        assert_eq!(m.quotas(), Some(&[5u64, 3, 2][..]));
        let mut layouts = HashSet::new();
        for step in 0..200 {
            let (sources, records) = m.batch_at(step);
            assert_eq!(counts(&sources, 3), [5, 3, 2], "step {step}");
            assert!(sources
                .iter()
                .zip(&records)
                .all(|(&k, &r)| r < [35, 13, 8][k as usize]));
            layouts.insert(sources);
        }
        assert!(layouts.len() > 150, "slots are not placed at random");
    }

    #[test]
    fn exact_sources_walk_their_own_epochs() {
        // Source k consumes q_k positions a step; with cyclic order every
        // run of length_k of its records is a permutation, whatever the
        // quotas (13 is not a multiple of 3: epochs straddle steps).
        let lengths = [35u64, 13, 8];
        let m = MixtureSampler::new(
            &lengths,
            &[5.0, 3.0, 2.0],
            10,
            Mode::Cyclic,
            Proportions::Exact,
            4,
        )
        .unwrap();
        let mut taken: Vec<Vec<u64>> = vec![Vec::new(); 3];
        for step in 0..(35 * 13 * 8) {
            let (sources, records) = m.batch_at(step);
            let perm = m_slot_order(&m, step);
            // Read the step's records in stream order (by slot value).
            let mut by_value: Vec<(u64, u32, u64)> = perm
                .iter()
                .zip(sources.iter().zip(&records))
                .map(|(&v, (&k, &r))| (v, k, r))
                .collect();
            by_value.sort_unstable();
            for (_, k, r) in by_value {
                taken[k as usize].push(r);
            }
        }
        for (k, seq) in taken.iter().enumerate() {
            let n = lengths[k] as usize;
            assert_eq!(seq.len() % n, 0);
            for (e, epoch) in seq.chunks(n).enumerate() {
                let mut sorted = epoch.to_vec();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..n as u64).collect::<Vec<_>>(),
                    "source {k} epoch {e}"
                );
            }
            // Consecutive epochs are different orders.
            assert_ne!(seq[..n], seq[n..2 * n]);
        }
    }

    /// The slot permutation of an exact mixture at `step`.
    fn m_slot_order(m: &MixtureSampler, step: u64) -> Vec<u64> {
        match &m.deal {
            Deal::Exact { slots, .. } => slots.batch_at(step),
            Deal::Iid { .. } => unreachable!(),
        }
    }

    #[test]
    fn iid_proportions_follow_the_weights() {
        let m = MixtureSampler::new(
            &[1000, 1000, 1000],
            &[6.0, 3.0, 1.0],
            100,
            Mode::Cyclic,
            Proportions::Iid,
            8,
        )
        .unwrap();
        assert_eq!(m.quotas(), None);
        let mut total = [0usize; 3];
        let mut per_batch = HashSet::new();
        for step in 0..2000 {
            let (sources, _) = m.batch_at(step);
            let c = counts(&sources, 3);
            per_batch.insert(c[0]);
            for k in 0..3 {
                total[k] += c[k];
            }
        }
        let n = 200_000.0;
        // Expected 120k / 60k / 20k; the standard deviations are about 220,
        // 200 and 134: allow five of them.
        for (k, &w) in [0.6f64, 0.3, 0.1].iter().enumerate() {
            let sd = (n * w * (1.0 - w)).sqrt();
            assert!((total[k] as f64 - n * w).abs() < 5.0 * sd, "{total:?}");
        }
        // Counts vary from batch to batch.
        assert!(per_batch.len() > 10);
    }

    #[test]
    fn iid_slots_read_their_position_of_the_source_stream() {
        let lengths = [50u64, 7];
        for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
            let m =
                MixtureSampler::new(&lengths, &[1.0, 1.0], 16, mode, Proportions::Iid, 5).unwrap();
            let base = derive(5, DOMAIN_SOURCE);
            let streams: Vec<Sampler> = (0..2)
                .map(|k| Sampler::new(lengths[k], 1, mode, derive(base, k as u64)).unwrap())
                .collect();
            for step in [0u64, 3, 1000] {
                let (sources, records) = m.batch_at(step);
                for (j, (&k, &r)) in sources.iter().zip(&records).enumerate() {
                    assert_eq!(
                        r,
                        streams[k as usize].batch_at(step * 16 + j as u64)[0],
                        "{mode}"
                    );
                }
            }
        }
    }

    #[test]
    fn batches_are_pure_functions_of_seed_and_step() {
        for p in [Proportions::Exact, Proportions::Iid] {
            let a = MixtureSampler::new(&[100, 30], &[0.7, 0.3], 20, Mode::Cyclic, p, 11).unwrap();
            let b = MixtureSampler::new(&[100, 30], &[0.7, 0.3], 20, Mode::Cyclic, p, 11).unwrap();
            let c = MixtureSampler::new(&[100, 30], &[0.7, 0.3], 20, Mode::Cyclic, p, 12).unwrap();
            for step in [0u64, 1, 77, u64::MAX] {
                assert_eq!(a.batch_at(step), b.batch_at(step));
                assert_ne!(a.batch_at(step), c.batch_at(step));
            }
        }
        // Pinned: a change of the streams breaks resuming recorded runs.
        let m = MixtureSampler::new(
            &[100, 30],
            &[0.7, 0.3],
            6,
            Mode::Cyclic,
            Proportions::Exact,
            42,
        )
        .unwrap();
        let (sources, records) = m.batch_at(1);
        assert_eq!((&sources[..], &records[..]), PIN_EXACT);
        let m = MixtureSampler::new(
            &[100, 30],
            &[0.7, 0.3],
            6,
            Mode::Cyclic,
            Proportions::Iid,
            42,
        )
        .unwrap();
        let (sources, records) = m.batch_at(1);
        assert_eq!((&sources[..], &records[..]), PIN_IID);
    }

    #[test]
    fn rank_counts_bounds_like_a_search() {
        // Both ways of counting (a pass per bound for few bounds, a search
        // for many) agree with `partition_point`, values on bounds included.
        for count in [0usize, 1, 2, 15, 16, 17, 40] {
            let bounds: Vec<u64> = (1..=count as u64).map(|b| b * b * 7).collect();
            let values: Vec<u64> = (0..12_000).collect();
            let mut got = vec![u32::MAX; values.len()];
            rank_into(&bounds, &values, &mut got);
            for (&v, &r) in values.iter().zip(&got) {
                assert_eq!(
                    r as usize,
                    bounds.partition_point(|&b| b <= v),
                    "{count} {v}"
                );
            }
        }
    }

    /// FNV-1a over the little-endian bytes of `x`.
    fn fnv(digest: &mut u64, x: u64) {
        for byte in x.to_le_bytes() {
            *digest ^= u64::from(byte);
            *digest = digest.wrapping_mul(0x100_0000_01b3);
        }
    }

    #[test]
    fn streams_are_pinned_across_modes_and_sizes() {
        // Digests of the (source, record) pairs of many steps, recorded
        // before IID mixtures evaluated each source's positions in batches
        // (and exact ones looked sources up without a search): how a batch
        // is computed may change, the batch may not. The cases cover every
        // mode and proportion, a source of one record, sources smaller than
        // the batch (positions crossing cycles within a step), sources wider
        // than 2^32, a batch wider than a chunk, and the last steps (cycle
        // numbers past 2^64).
        let cases: [(&[u64], &[f64], u64, u64); 6] = [
            (&[15_000, 9_000, 6_000], &[0.5, 0.3, 0.2], 256, 1),
            (&[100, 30], &[0.7, 0.3], 6, 42),
            (&[7, 1, 50, 4097, 3], &[1.0, 2.0, 3.0, 4.0, 5.0], 1000, 9),
            (
                &[(1 << 40) + 3, 5, (1 << 33) + 1],
                &[0.25, 0.25, 0.5],
                300,
                3,
            ),
            (&[1000], &[1.0], 64, 5),
            (&[65_537, 131_072, 70_000], &[1.0, 1.0, 1.0], 200_000, 2),
        ];
        // Per case: sequential, iid, cyclic mode, each exact then iid.
        let want: [[u64; 6]; 6] = [
            [
                0xc7e5_4ccb_f075_ec0f,
                0xc888_79a9_3a13_b9ca,
                0xe146_4f47_a8fd_799f,
                0x9e70_500f_de4e_b113,
                0x33e8_08c7_1070_a934,
                0x456a_0355_8880_3220,
            ],
            [
                0x1002_d010_a4a0_5865,
                0x9697_c95e_1889_7cec,
                0x5609_6b9f_5f37_96c6,
                0xb938_0cbe_84bc_116c,
                0xb5ec_61d7_f77e_7dfe,
                0x72e5_2ee5_485a_c686,
            ],
            [
                0x3869_f849_ab63_0773,
                0x7a80_bd5a_cb94_5197,
                0x8eb3_ac34_49b2_638a,
                0xe62c_4392_153e_5d35,
                0x9f61_b1fe_9554_602e,
                0x3382_1dbf_7b43_dcca,
            ],
            [
                0xd057_e123_14a4_3f80,
                0x6cc4_78cf_b07e_fd10,
                0x212b_2a35_239d_3c0c,
                0x0846_e639_3ba9_7503,
                0xfc1f_c0a3_b5ae_5db2,
                0x9ab3_c27c_bfce_fba5,
            ],
            [
                0x02f5_f2e7_0c8d_fe25,
                0x6592_2de8_a791_4c85,
                0xc689_ed0b_ee49_a5df,
                0x03a3_6301_714e_b9b3,
                0x67b9_fa92_ffca_75f5,
                0xf06a_9171_d78f_8cf9,
            ],
            [
                0x72ab_08f8_b791_4a58,
                0x9d6e_30dd_50da_13c5,
                0x15f5_f870_fb24_476f,
                0xc824_e8ed_a72d_d42f,
                0x9396_c85a_b8e8_be3c,
                0x6514_461a_83d1_ac31,
            ],
        ];
        for ((lengths, weights, batch, seed), want) in cases.into_iter().zip(want) {
            let steps: Vec<u64> = if batch > 10_000 {
                vec![0, 1, 77, u64::MAX]
            } else {
                (0..50)
                    .chain([1000, 123_456_789, u64::MAX - 1, u64::MAX])
                    .collect()
            };
            let mut want = want.into_iter();
            for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
                for p in [Proportions::Exact, Proportions::Iid] {
                    let m = MixtureSampler::new(lengths, weights, batch, mode, p, seed).unwrap();
                    let mut digest = 0xcbf2_9ce4_8422_2325u64;
                    for &step in &steps {
                        let (sources, records) = m.batch_at(step);
                        for (&k, &r) in sources.iter().zip(&records) {
                            fnv(&mut digest, u64::from(k));
                            fnv(&mut digest, r);
                        }
                    }
                    assert_eq!(
                        digest,
                        want.next().unwrap(),
                        "{lengths:?} batch {batch} {mode} {}",
                        p.name()
                    );
                }
            }
        }
        // The benchmark's mixture, spelled out: slots 0..4 of step 1.
        let m = MixtureSampler::new(
            &[15_000, 9_000, 6_000],
            &[0.5, 0.3, 0.2],
            256,
            Mode::Cyclic,
            Proportions::Iid,
            1,
        )
        .unwrap();
        let (sources, records) = m.batch_at(1);
        assert_eq!(sources[..4], [0, 1, 0, 1]);
        assert_eq!(records[..4], [14229, 2581, 8530, 6595]);
    }

    type Pin = (&'static [u32], &'static [u64]);
    const PIN_EXACT: Pin = (&[0, 1, 0, 0, 0, 1], &[41, 13, 59, 65, 10, 15]);
    const PIN_IID: Pin = (&[0, 0, 1, 1, 1, 0], &[65, 10, 14, 25, 4, 11]);
}
