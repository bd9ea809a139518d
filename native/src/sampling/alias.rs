//! Weighted sampling with replacement in O(1) per draw: Vose's alias table.
//!
//! The table is built once per population, in place in the memory it will be
//! read from (`build_alias`): a section of the population's mapped rows file,
//! so that a 10^9-row table costs disk and page cache, not process memory. The
//! same function builds the tables of vectors (`AliasTable::new`), so both give
//! the same table, entry for entry, for the same weights.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::{CheckedPages, Plain, Slab};

/// One column of the table: kept when the 32-bit fraction is below
/// `threshold`, otherwise `alias` is drawn. Eight bytes, so a draw touches one
/// cache line; the layout is the rows file's (docs/storage-format.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct AliasColumn {
    pub threshold: u32,
    pub alias: u32,
}

// SAFETY: two u32s, no padding, any bit pattern valid.
unsafe impl Plain for AliasColumn {}

impl AliasColumn {
    /// While the table is built, an unfinished column holds its scaled weight.
    fn scaled(self) -> f64 {
        f64::from_bits(u64::from(self.threshold) | (u64::from(self.alias) << 32))
    }

    fn holding(scaled: f64) -> Self {
        let bits = scaled.to_bits();
        AliasColumn {
            threshold: bits as u32,
            alias: (bits >> 32) as u32,
        }
    }
}

/// Fill `columns` (one per weight) with the alias table of `weights`, whose sum
/// in row order is `total`. `stack` (as long as `weights`) is working space:
/// Vose's small and large lists, growing from its two ends. Weights are finite
/// and > 0 (the population validates them). True when every column keeps
/// itself (all weights on one side of their mean: equal, up to rounding), so
/// that a draw is its column and the table need not be read.
pub fn build_alias(
    weights: &[f64],
    total: f64,
    columns: &mut [AliasColumn],
    stack: &mut [u32],
) -> Result<bool> {
    let n = weights.len();
    if n == 0 {
        return Err(Error::invalid("cannot sample from an empty population"));
    }
    if n > u32::MAX as usize {
        return Err(Error::invalid(format!(
            "a population holds at most {} rows, got {n}",
            u32::MAX
        )));
    }
    if columns.len() != n || stack.len() != n {
        return Err(Error::internal(
            "an alias table needs a column and a stack slot per weight",
        ));
    }
    if !total.is_finite() || total <= 0.0 {
        return Err(Error::population(format!(
            "the weights sum to {total}; their sum must be finite and > 0 \
             (scale the weights down)"
        )));
    }
    let scale = n as f64 / total;
    // small: stack[..small]; large: stack[n - large..], its top at n - large.
    let (mut small, mut large) = (0usize, 0usize);
    for (i, &w) in weights.iter().enumerate() {
        let p = w * scale;
        columns[i] = AliasColumn::holding(p);
        if p < 1.0 {
            stack[small] = i as u32;
            small += 1;
        } else {
            large += 1;
            stack[n - large] = i as u32;
        }
    }
    // No column is paired with another when all are on one side of the mean.
    let keeps_every_column = small == 0 || large == 0;
    while small > 0 && large > 0 {
        small -= 1;
        let s = stack[small] as usize;
        let l = stack[n - large] as usize;
        let p_s = columns[s].scaled();
        columns[s] = AliasColumn {
            threshold: fraction_to_threshold(p_s),
            alias: l as u32,
        };
        let p_l = columns[l].scaled() - (1.0 - p_s);
        columns[l] = AliasColumn::holding(p_l);
        if p_l < 1.0 {
            large -= 1;
            stack[small] = l as u32;
            small += 1;
        }
    }
    // Whatever remains is 1.0 up to rounding: those columns keep themselves
    // (a column that keeps itself has itself as alias, so its threshold does
    // not matter).
    for &i in stack[..small].iter().chain(&stack[n - large..]) {
        columns[i as usize] = AliasColumn {
            threshold: u32::MAX,
            alias: i,
        };
    }
    Ok(keeps_every_column)
}

fn fraction_to_threshold(p: f64) -> u32 {
    if p >= 1.0 {
        u32::MAX
    } else if p <= 0.0 {
        0
    } else {
        (p * 4_294_967_296.0) as u32
    }
}

/// The alias table of a population, read where it is stored.
pub struct AliasTable {
    columns: Slab<AliasColumn>,
    /// The pages `columns` lie in, verified on first touch; `at` is the
    /// byte offset of column 0 in them.
    pages: Arc<CheckedPages>,
    at: usize,
    /// Set while the stored table is not in memory (`warmup`).
    cold: crate::warmup::Cold,
    /// Every column keeps itself (`build_alias`): a draw is its column, with
    /// no read of the table (for a population of equal weights, one random
    /// read a draw less).
    keeps_every_column: bool,
}

impl AliasTable {
    /// Build from weights that are finite and > 0, in memory.
    pub fn new(weights: &[f64]) -> Result<Self> {
        let total: f64 = weights.iter().sum();
        let mut columns = vec![
            AliasColumn {
                threshold: 0,
                alias: 0
            };
            weights.len()
        ];
        let mut stack = vec![0u32; weights.len()];
        let keeps_every_column = build_alias(weights, total, &mut columns, &mut stack)?;
        crate::os::prefetch::huge_pages(&columns);
        Ok(AliasTable {
            columns: Slab::from_vec(columns),
            pages: Arc::new(CheckedPages::trusted()),
            at: 0,
            cold: Default::default(),
            keeps_every_column,
        })
    }

    /// A table built by `build_alias` where `columns` holds it, at byte `at`
    /// of `pages`; `cold` while its file is not in memory;
    /// `keeps_every_column` as `build_alias` returned it.
    pub fn stored(
        columns: Slab<AliasColumn>,
        at: usize,
        pages: Arc<CheckedPages>,
        cold: crate::warmup::Cold,
        keeps_every_column: bool,
    ) -> Self {
        AliasTable {
            columns,
            pages,
            at,
            cold,
            keeps_every_column,
        }
    }

    pub fn len(&self) -> usize {
        self.columns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The row drawn by the random word `word`: of the 128-bit product
    /// `word * rows`, the high 64 bits pick the column and the next 32 bits
    /// (bits 32..64) are the fraction; the column is kept when the fraction is
    /// below its threshold, otherwise its alias is drawn.
    #[inline]
    pub fn sample(&self, word: u64) -> usize {
        let product = word as u128 * self.columns.len() as u128;
        if self.keeps_every_column {
            return (product >> 64) as usize;
        }
        self.pages.touch(self.at + (product >> 64) as usize * 8);
        let column = self.columns[(product >> 64) as usize];
        let fraction = ((product as u64) >> 32) as u32;
        if fraction < column.threshold {
            (product >> 64) as usize
        } else {
            column.alias as usize
        }
    }

    /// Draw the rows of many words at once: the table entries of a block are
    /// prefetched before any is read, so their cache misses overlap instead of
    /// being paid one after another; while the table is cold, their pages
    /// are read together too. Same results as `sample` word by word.
    pub fn sample_many(&self, words: impl Iterator<Item = u64>, out: &mut Vec<u32>) {
        const BLOCK: usize = 32;
        let columns: &[AliasColumn] = &self.columns;
        let n = columns.len() as u128;
        if self.keeps_every_column {
            out.extend(words.map(|word| ((word as u128 * n) >> 64) as u32));
            return;
        }
        let mut products = [0u128; BLOCK];
        let mut words = words.peekable();
        while words.peek().is_some() {
            let cold = self.cold.is_cold();
            let mut filled = 0;
            for (slot, word) in products.iter_mut().zip(words.by_ref()) {
                *slot = word as u128 * n;
                let entry = &columns[(*slot >> 64) as usize];
                if cold {
                    crate::warmup::will_need(entry);
                }
                crate::os::prefetch::prefetch_line(entry);
                filled += 1;
            }
            for &product in &products[..filled] {
                let column = (product >> 64) as usize;
                self.pages.touch(self.at + column * 8);
                let entry = columns[column];
                let fraction = ((product as u64) >> 32) as u32;
                out.push(if fraction < entry.threshold {
                    column as u32
                } else {
                    entry.alias
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Vose's algorithm as it was written before the table moved into files
    /// (two vectors of indices, a vector of scaled weights): the tables of
    /// stored populations and the streams drawn from them must not change.
    fn reference(weights: &[f64]) -> Vec<AliasColumn> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        let scale = n as f64 / total;
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * scale).collect();
        let (mut small, mut large) = (Vec::new(), Vec::new());
        for (i, &p) in scaled.iter().enumerate() {
            if p < 1.0 {
                small.push(i);
            } else {
                large.push(i);
            }
        }
        let mut columns: Vec<AliasColumn> = (0..n as u32)
            .map(|i| AliasColumn {
                threshold: u32::MAX,
                alias: i,
            })
            .collect();
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            columns[s] = AliasColumn {
                threshold: fraction_to_threshold(scaled[s]),
                alias: l as u32,
            };
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        columns
    }

    proptest! {
        #[test]
        fn the_table_built_in_place_is_the_reference_table(
            weights in prop::collection::vec(
                prop_oneof![Just(1.0), 0.001f64..1000.0, Just(1e-9), Just(7.5)], 1..400)
        ) {
            let table = AliasTable::new(&weights).unwrap();
            prop_assert_eq!(&*table.columns, &reference(&weights)[..]);
        }

        #[test]
        fn a_table_that_keeps_every_column_draws_as_when_it_is_read(
            weights in prop_oneof![
                (1usize..2000, prop_oneof![Just(1.0), Just(0.1), 0.001f64..1000.0])
                    .prop_map(|(n, w)| vec![w; n]),
                prop::collection::vec(prop_oneof![Just(1.0), Just(2.0)], 1..50),
            ],
            seed in any::<u64>(),
        ) {
            let table = AliasTable::new(&weights).unwrap();
            let keeps = reference(&weights)
                .iter()
                .enumerate()
                .all(|(i, column)| column.alias as usize == i);
            prop_assert_eq!(table.keeps_every_column, keeps);
            let read = AliasTable { keeps_every_column: false, ..AliasTable::new(&weights).unwrap() };
            let words: Vec<u64> = (0..500).map(|k| crate::sampling::word_at(seed, k)).collect();
            let (mut drawn, mut drawn_reading) = (Vec::new(), Vec::new());
            table.sample_many(words.iter().copied(), &mut drawn);
            read.sample_many(words.iter().copied(), &mut drawn_reading);
            prop_assert_eq!(&drawn, &drawn_reading);
            for (&word, &row) in words.iter().zip(&drawn) {
                prop_assert_eq!(table.sample(word), row as usize);
                prop_assert_eq!(read.sample(word), row as usize);
            }
        }
    }

    #[test]
    fn equal_weights_keep_every_column_and_unequal_ones_do_not() {
        assert!(AliasTable::new(&[1.0; 1000]).unwrap().keeps_every_column);
        assert!(AliasTable::new(&[3.5]).unwrap().keeps_every_column);
        assert!(
            !AliasTable::new(&[1.0, 2.0, 1.0])
                .unwrap()
                .keeps_every_column
        );
    }
}
