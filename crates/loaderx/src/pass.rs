//! Finite passes: every record exactly once per epoch, then the end.
//!
//! A [`Pass`] cuts each epoch's order of `0..length` into
//! `steps_per_epoch = ceil(length / batch_size)` global batches. The last
//! batch of an epoch is filled up to `batch_size` with padding, marked by a
//! `false` in the mask, so every shard of a sharded run takes the same
//! number of steps and holds batches of the same size.
//!
//! # Stream definitions
//!
//! Step `s` belongs to epoch `e = s / steps_per_epoch` and covers positions
//! `p = t * batch_size + j` (slot `j`, `t = s % steps_per_epoch`) of that
//! epoch's order. Slots with `p < length` hold record `r(e * length + p)` of
//! the position stream of a [`Sampler`] over `length` records with the
//! pass's mode and seed (see "Position streams" in [`crate::sampler`]):
//!
//! * [`Mode::Sequential`]: `p` itself, so epochs are in storage order;
//! * [`Mode::Cyclic`]: position `p` of the permutation of cycle `e`, the
//!   same permutation the endless cyclic stream uses for its cycle `e`, read
//!   in full (the endless stream skips the last `length % batch_size`);
//! * [`Mode::Iid`] is refused: independent draws cannot promise that each
//!   record comes exactly once.
//!
//! A slot with `p >= length` (only in an epoch's last step) is padding: it
//! repeats the record of slot `j % real`, where `real = length - t *
//! batch_size` is the number of real slots, and its mask is `false`.
//!
//! ```
//! use loaderx::pass::Pass;
//! use loaderx::sampler::Mode;
//!
//! let pass = Pass::new(10, 4, Mode::Sequential, 0, 2).unwrap();
//! assert_eq!((pass.steps_per_epoch(), pass.steps()), (3, 6));
//! let (records, mask) = pass.batch_at(2);
//! assert_eq!(records, [8, 9, 8, 9]);
//! assert_eq!(mask, [true, true, false, false]);
//! assert_eq!(pass.batch_at(3).0, [0, 1, 2, 3]); // the second epoch
//! ```

use thiserror::Error;

use crate::sampler::{Mode, Sampler, SamplerError};

/// Why a [`Pass`] could not be built.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PassError {
    /// IID draws cannot visit each record exactly once.
    #[error("a finite pass needs mode 0 (sequential) or 2 (cyclic): iid draws (mode 1) cannot visit every record exactly once")]
    Iid,
    /// `epochs` was zero.
    #[error("epochs must be at least 1")]
    ZeroEpochs,
    /// The pass would have more than `u64::MAX` steps.
    #[error("{epochs} epochs of {steps_per_epoch} steps are more steps than a u64 counts")]
    TooManySteps {
        /// Epochs asked for.
        epochs: u64,
        /// Steps per epoch.
        steps_per_epoch: u64,
    },
    /// The length or batch size is invalid.
    #[error("{0}")]
    Sampler(SamplerError),
}

/// A finite sequence of padded batches covering `0..length` once per epoch.
/// See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Pass {
    length: u64,
    batch_size: u64,
    batch_len: usize,
    epochs: u64,
    steps_per_epoch: u64,
    steps: u64,
    order: Sampler,
}

impl Pass {
    /// `epochs` passes over `length` records in batches of `batch_size`.
    pub fn new(
        length: u64,
        batch_size: u64,
        mode: Mode,
        seed: u64,
        epochs: u64,
    ) -> Result<Pass, PassError> {
        if mode == Mode::Iid {
            return Err(PassError::Iid);
        }
        if epochs == 0 {
            return Err(PassError::ZeroEpochs);
        }
        let order = Sampler::new(length, 1, mode, seed).map_err(PassError::Sampler)?;
        // An IID sampler never shortens its batch: it checks the size
        // (zero, too large) exactly as the pass needs.
        let batch_len = Sampler::new(1, batch_size, Mode::Iid, 0)
            .map_err(PassError::Sampler)?
            .batch_len();
        let steps_per_epoch = length.div_ceil(batch_size);
        let steps = epochs
            .checked_mul(steps_per_epoch)
            .ok_or(PassError::TooManySteps {
                epochs,
                steps_per_epoch,
            })?;
        Ok(Pass {
            length,
            batch_size,
            batch_len,
            epochs,
            steps_per_epoch,
            steps,
            order,
        })
    }

    /// Records per epoch.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Slots per global batch (the batch size).
    pub fn batch_len(&self) -> usize {
        self.batch_len
    }

    /// Number of epochs.
    pub fn epochs(&self) -> u64 {
        self.epochs
    }

    /// `ceil(length / batch_size)`.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// Steps in the whole pass: `epochs * steps_per_epoch`.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Number of real (unpadded) slots of step `step`.
    pub fn real_slots(&self, step: u64) -> usize {
        let t = step % self.steps_per_epoch;
        let left = u128::from(self.length) - u128::from(t) * u128::from(self.batch_size);
        usize::try_from(left).map_or(self.batch_len, |l| l.min(self.batch_len))
    }

    /// Writes step `step` (steps past [`steps`](Self::steps) continue with
    /// further epochs): `records[j]` is slot `j`'s record, `mask[j]` whether
    /// it is real rather than padding.
    ///
    /// # Panics
    ///
    /// If either buffer's length is not [`batch_len`](Self::batch_len).
    pub fn fill(&self, step: u64, records: &mut [u64], mask: &mut [bool]) {
        assert!(
            records.len() == self.batch_len && mask.len() == self.batch_len,
            "output buffers hold {} and {} slots but a batch has {}",
            records.len(),
            mask.len(),
            self.batch_len
        );
        let epoch = step / self.steps_per_epoch;
        let t = step % self.steps_per_epoch;
        let real = self.real_slots(step);
        let first = u128::from(epoch) * u128::from(self.length)
            + u128::from(t) * u128::from(self.batch_size);
        self.order.fill_positions(first, &mut records[..real]);
        for j in real..records.len() {
            records[j] = records[j % real];
        }
        mask[..real].fill(true);
        mask[real..].fill(false);
    }

    /// Step `step` as new `(records, mask)` vectors.
    pub fn batch_at(&self, step: u64) -> (Vec<u64>, Vec<bool>) {
        let mut records = vec![0; self.batch_len];
        let mut mask = vec![false; self.batch_len];
        self.fill(step, &mut records, &mut mask);
        (records, mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_once_per_epoch_then_padding() {
        for mode in [Mode::Sequential, Mode::Cyclic] {
            for length in [1u64, 7, 10, 53] {
                for bs in [1u64, 3, 4, 8, 64] {
                    let pass = Pass::new(length, bs, mode, 3, 2).unwrap();
                    let per_epoch = length.div_ceil(bs);
                    assert_eq!(
                        (pass.steps_per_epoch(), pass.steps()),
                        (per_epoch, 2 * per_epoch)
                    );
                    let mut epochs = Vec::new();
                    for e in 0..2 {
                        let mut real = Vec::new();
                        let mut padded = 0;
                        for t in 0..per_epoch {
                            let (records, mask) = pass.batch_at(e * per_epoch + t);
                            assert_eq!(records.len() as u64, bs);
                            assert!(records.iter().all(|&r| r < length));
                            // Padding only at the end of an epoch's last batch.
                            let first_pad = mask.iter().position(|&m| !m).unwrap_or(mask.len());
                            assert!(mask[first_pad..].iter().all(|&m| !m));
                            if t + 1 < per_epoch {
                                assert_eq!(first_pad, mask.len());
                            }
                            real.extend_from_slice(&records[..first_pad]);
                            padded += mask.len() - first_pad;
                        }
                        assert_eq!(padded as u64, per_epoch * bs - length);
                        let in_order = real.clone();
                        real.sort_unstable();
                        assert_eq!(
                            real,
                            (0..length).collect::<Vec<_>>(),
                            "{mode} {length}/{bs}"
                        );
                        if mode == Mode::Sequential {
                            assert_eq!(in_order, real);
                        }
                        epochs.push(in_order);
                    }
                    if mode == Mode::Cyclic && length > 5 {
                        assert_ne!(epochs[0], epochs[1], "epochs share one order");
                    }
                }
            }
        }
    }

    #[test]
    fn cyclic_epochs_follow_the_endless_cycles() {
        // Epoch e is the endless cyclic stream's cycle e, read to the end.
        let endless = Sampler::new(53, 10, Mode::Cyclic, 7).unwrap();
        let pass = Pass::new(53, 10, Mode::Cyclic, 7, 3).unwrap();
        for e in 0..3u64 {
            for t in 0..5 {
                let (records, mask) = pass.batch_at(e * 6 + t);
                assert!(mask.iter().all(|&m| m));
                assert_eq!(records, endless.batch_at(e * 5 + t));
            }
        }
        // The last batch: 3 real records, then repeats of them.
        let (records, mask) = pass.batch_at(5);
        assert_eq!(
            mask,
            [true, true, true, false, false, false, false, false, false, false]
        );
        for j in 3..10 {
            assert_eq!(records[j], records[j % 3]);
        }
        assert_eq!(pass.real_slots(5), 3);
        assert_eq!(pass.real_slots(4), 10);
    }

    #[test]
    fn bad_passes_are_refused() {
        assert_eq!(
            Pass::new(10, 2, Mode::Iid, 0, 1).unwrap_err(),
            PassError::Iid
        );
        assert_eq!(
            Pass::new(10, 2, Mode::Cyclic, 0, 0).unwrap_err(),
            PassError::ZeroEpochs
        );
        assert_eq!(
            Pass::new(0, 2, Mode::Cyclic, 0, 1).unwrap_err(),
            PassError::Sampler(SamplerError::ZeroLength)
        );
        assert_eq!(
            Pass::new(10, 0, Mode::Cyclic, 0, 1).unwrap_err(),
            PassError::Sampler(SamplerError::ZeroBatchSize)
        );
        assert!(matches!(
            Pass::new(10, u64::MAX, Mode::Sequential, 0, 1).unwrap_err(),
            PassError::Sampler(SamplerError::BatchTooLarge(_))
        ));
        assert_eq!(
            Pass::new(u64::MAX, 1, Mode::Sequential, 0, 2).unwrap_err(),
            PassError::TooManySteps {
                epochs: 2,
                steps_per_epoch: u64::MAX
            }
        );
        // The largest pass still works at its far end.
        let huge = Pass::new(u64::MAX, 4, Mode::Cyclic, 0, 1).unwrap();
        let (records, mask) = huge.batch_at(huge.steps() - 1);
        assert_eq!(mask, [true, true, true, false]);
        assert!(records.iter().all(|&r| r < u64::MAX));
    }
}
