//! Dictionary training for `zstd_dict` stores.
//!
//! A dictionary is trained once, on settled data, with zstd's own trainer.
//! Three tiers fix the trade-off between ratio and gather cost: the
//! dictionary size and the byte budget of the training sample. The sample is
//! an evenly spread subset of the records, collected in one pass by
//! [`SampleCollector`] even when the number of records is not known up front.
//!
//! ```
//! use loaderx::dict::{SampleCollector, Tier};
//!
//! let tier = Tier::from_name("fast")?;
//! let mut samples = SampleCollector::new(tier.sample_bytes);
//! for i in 0..2000u32 {
//!     let record: Vec<u8> = format!("record {i}: sensor=ok temp={} unit=C;", i % 40).into_bytes();
//!     samples.push(&record);
//! }
//! let dict = samples.train(tier.dict_bytes)?;
//! assert!(!dict.is_empty() && dict.len() <= tier.dict_bytes);
//! # Ok::<(), loaderx::Error>(())
//! ```

use crate::error::{Error, Result};

/// A preset dictionary size and training budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tier {
    /// `"fast"`, `"balanced"` or `"max"`.
    pub name: &'static str,
    /// Largest dictionary the tier trains.
    pub dict_bytes: usize,
    /// Byte budget of the training sample.
    pub sample_bytes: usize,
}

/// The tiers, smallest first. `"balanced"` is the default.
pub const TIERS: [Tier; 3] = [
    Tier {
        name: "fast",
        dict_bytes: 32 << 10,
        sample_bytes: 4 << 20,
    },
    Tier {
        name: "balanced",
        dict_bytes: 128 << 10,
        sample_bytes: 16 << 20,
    },
    Tier {
        name: "max",
        dict_bytes: 1 << 20,
        sample_bytes: 64 << 20,
    },
];

/// Name of the default tier.
pub const DEFAULT_TIER: &str = "balanced";

impl Tier {
    /// Looks a tier up by name.
    pub fn from_name(name: &str) -> Result<Tier> {
        TIERS
            .iter()
            .copied()
            .find(|t| t.name == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown dictionary tier {name:?}: expected \"fast\", \"balanced\" or \"max\""
                ))
            })
    }
}

/// Collects an evenly spread sample of a stream of records within a byte budget.
///
/// Records are kept at a stride; whenever the kept bytes exceed the budget,
/// every other kept record is dropped and the stride doubles. The result is
/// every `stride`-th record of the stream (truncated to the budget when a
/// single record is larger), whatever the stream's length.
#[derive(Debug)]
pub struct SampleCollector {
    budget: usize,
    stride: u64,
    seen: u64,
    data: Vec<u8>,
    sizes: Vec<usize>,
    positions: Vec<u64>,
}

impl SampleCollector {
    /// A collector keeping at most about `budget` bytes.
    pub fn new(budget: usize) -> Self {
        SampleCollector {
            budget: budget.max(1),
            stride: 1,
            seen: 0,
            data: Vec::new(),
            sizes: Vec::new(),
            positions: Vec::new(),
        }
    }

    /// Offers the next record of the stream.
    pub fn push(&mut self, record: &[u8]) {
        let position = self.seen;
        self.seen += 1;
        if !position.is_multiple_of(self.stride) || record.is_empty() {
            return;
        }
        let take = record.len().min(self.budget);
        self.data.extend_from_slice(&record[..take]);
        self.sizes.push(take);
        self.positions.push(position);
        while self.data.len() > self.budget && self.sizes.len() > 1 {
            self.thin();
        }
    }

    /// Offers `data.len() / width` records of `width` bytes each.
    pub fn push_rows(&mut self, data: &[u8], width: usize) {
        if width == 0 {
            return;
        }
        for row in data.chunks_exact(width) {
            self.push(row);
        }
    }

    /// Drops the kept records that are not on the doubled stride.
    fn thin(&mut self) {
        let stride = self.stride * 2;
        let mut read = 0usize;
        let mut write = 0usize;
        let mut kept = 0usize;
        for k in 0..self.sizes.len() {
            let size = self.sizes[k];
            if self.positions[k].is_multiple_of(stride) {
                self.data.copy_within(read..read + size, write);
                self.sizes[kept] = size;
                self.positions[kept] = self.positions[k];
                write += size;
                kept += 1;
            }
            read += size;
        }
        self.data.truncate(write);
        self.sizes.truncate(kept);
        self.positions.truncate(kept);
        self.stride = stride;
    }

    /// Number of records offered so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Number of records kept.
    pub fn kept(&self) -> usize {
        self.sizes.len()
    }

    /// Bytes kept.
    pub fn kept_bytes(&self) -> usize {
        self.data.len()
    }

    /// Trains a dictionary of at most `max_dict` bytes on the kept sample.
    pub fn train(&self, max_dict: usize) -> Result<Vec<u8>> {
        train(&self.data, &self.sizes, max_dict)
    }
}

/// Trains a dictionary of at most `max_dict` bytes on samples laid back to
/// back in `data`, of lengths `sizes`.
pub fn train(data: &[u8], sizes: &[usize], max_dict: usize) -> Result<Vec<u8>> {
    if sizes.is_empty() || data.is_empty() {
        return Err(Error::InvalidArgument(
            "cannot train a dictionary on no data".into(),
        ));
    }
    let dict = zstd::dict::from_continuous(data, sizes, max_dict).map_err(|e| {
        Error::DictTraining(format!(
            "zstd could not train a {max_dict}-byte dictionary on {} samples ({} bytes): {e}",
            sizes.len(),
            data.len()
        ))
    })?;
    if dict.is_empty() {
        return Err(Error::DictTraining(
            "zstd produced an empty dictionary".into(),
        ));
    }
    Ok(dict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers() {
        assert_eq!(Tier::from_name("fast").unwrap().dict_bytes, 32 * 1024);
        assert_eq!(Tier::from_name("balanced").unwrap().sample_bytes, 16 << 20);
        assert_eq!(Tier::from_name("max").unwrap().dict_bytes, 1 << 20);
        assert!(Tier::from_name("huge").is_err());
    }

    #[test]
    fn collector_is_evenly_spread_and_bounded() {
        let mut c = SampleCollector::new(1000);
        for i in 0..1000u32 {
            c.push(&[i as u8; 10]);
        }
        assert!(c.kept_bytes() <= 1000);
        assert_eq!(c.seen(), 1000);
        // Every kept record sits on one stride.
        let stride = c.stride;
        assert!(c.positions.iter().all(|p| p % stride == 0));
        assert_eq!(c.positions.len() as u64, 1000u64.div_ceil(stride));
        // Kept bytes are the records at those positions.
        for (k, &p) in c.positions.iter().enumerate() {
            assert_eq!(c.data[k * 10], p as u8);
        }
    }

    #[test]
    fn oversized_record_is_truncated() {
        let mut c = SampleCollector::new(100);
        c.push(&[7u8; 1000]);
        assert_eq!(c.kept_bytes(), 100);
    }

    #[test]
    fn empty_input_is_an_argument_error() {
        let c = SampleCollector::new(100);
        assert!(matches!(c.train(1024), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn too_little_data_is_a_training_error() {
        let mut c = SampleCollector::new(100);
        c.push(b"ab");
        assert!(matches!(c.train(1024), Err(Error::DictTraining(_))));
    }
}
