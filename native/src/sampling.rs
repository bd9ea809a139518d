//! Counter-based draws: position `k` of a stream is a pure function of
//! (population, seed, k), computed in O(1) without the positions before it.
//!
//! The generator is SplitMix64 used as a counter-based hash: the random word for
//! position `k` is `mix(key + (k + 1) * GAMMA)`, where `key` is the mixed seed.
//! Weighted draws use Vose's alias table (built in O(rows), O(1) per draw): of
//! the 128-bit product `word * rows`, the high 64 bits pick a column and bits
//! 32..64 (the top 32 bits of the low half; the lowest 32 bits are discarded) are
//! a 32-bit fraction compared with the column's 32-bit threshold. A threshold is
//! the column's own share rounded down to a multiple of 2^-32, so weights are
//! resolved to a quantum of 2^-32 per column (2^-32 of the mean weight); see
//! `docs/sampling.md`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod alias;
mod permutation;
mod window;

pub use alias::{build_alias, AliasColumn, AliasTable};
pub use permutation::Permutation;
pub use window::{Partition, Positions, StreamWindow, MAX_WORLD_SIZE};

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream key of `seed` (computed once per stream, not per draw).
#[inline]
pub fn stream_key(seed: u64) -> u64 {
    mix64(seed ^ 0x6A09_E667_F3BC_C908)
}

/// The random word of `position` in the stream whose key is `key`.
#[inline]
pub fn word_at_key(key: u64, position: u64) -> u64 {
    mix64(key.wrapping_add(position.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// The random word of `position` in the stream of `seed`.
#[inline]
pub fn word_at(seed: u64, position: u64) -> u64 {
    word_at_key(stream_key(seed), position)
}

/// How a stream draws rows: the `shuffle` key, `true | false | "permutation"`
/// (the booleans keep their meaning from before the third mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ShuffleKey", into = "ShuffleKey")]
pub enum ShuffleMode {
    /// `false`: the rows in table order, cyclically.
    Ordered,
    /// `true`: weighted draws with replacement.
    Weighted,
    /// `"permutation"`: every row once per cycle of `rows` positions, in a fresh
    /// pseudo-random order each cycle; weights are ignored.
    Permutation,
}

/// The JSON and Python spellings of a `ShuffleMode`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ShuffleKey {
    Bool(bool),
    Name(String),
}

impl TryFrom<ShuffleKey> for ShuffleMode {
    type Error = Error;

    fn try_from(key: ShuffleKey) -> Result<Self> {
        match key {
            ShuffleKey::Bool(true) => Ok(ShuffleMode::Weighted),
            ShuffleKey::Bool(false) => Ok(ShuffleMode::Ordered),
            ShuffleKey::Name(name) if name == "permutation" => Ok(ShuffleMode::Permutation),
            ShuffleKey::Name(name) => Err(Error::invalid(format!(
                "'shuffle' must be true (weighted draws), false (table order) or \
                 \"permutation\" (every row once per cycle), got {name:?}"
            ))),
        }
    }
}

impl From<ShuffleMode> for ShuffleKey {
    fn from(mode: ShuffleMode) -> ShuffleKey {
        match mode {
            ShuffleMode::Weighted => ShuffleKey::Bool(true),
            ShuffleMode::Ordered => ShuffleKey::Bool(false),
            ShuffleMode::Permutation => ShuffleKey::Name("permutation".into()),
        }
    }
}

/// How stream positions map to rows of the active population.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOrder {
    /// The rows in table order, cyclically.
    Sequential,
    /// Weighted multinomial draws with replacement; `key` is `stream_key(seed)`.
    Weighted { key: u64 },
    /// Position `k` is row `pi_c(k mod rows)` with `c = k div rows` the cycle
    /// and `pi_c` the `Permutation` of `[0, rows)` keyed by (`key`, `c`).
    Permuted { key: u64 },
}

impl StreamOrder {
    pub fn new(mode: ShuffleMode, seed: u64) -> Self {
        let key = stream_key(seed);
        match mode {
            ShuffleMode::Ordered => StreamOrder::Sequential,
            ShuffleMode::Weighted => StreamOrder::Weighted { key },
            ShuffleMode::Permutation => StreamOrder::Permuted { key },
        }
    }

    /// The population rows drawn at `positions`, appended to `out`.
    pub fn rows_at(
        self,
        table: &AliasTable,
        positions: impl Iterator<Item = u64>,
        out: &mut Vec<u32>,
    ) {
        match self {
            StreamOrder::Sequential => {
                out.extend(positions.map(|p| (p % table.len().max(1) as u64) as u32))
            }
            StreamOrder::Weighted { key } => {
                table.sample_many(positions.map(|p| word_at_key(key, p)), out)
            }
            StreamOrder::Permuted { key } => {
                let rows = table.len().max(1) as u64;
                // A window's positions move through few cycles: build each
                // cycle's permutation once, not once per position.
                let mut current: Option<(u64, Permutation)> = None;
                out.extend(positions.map(|p| {
                    let cycle = p / rows;
                    let permutation = match current {
                        Some((c, permutation)) if c == cycle => permutation,
                        _ => {
                            let permutation = cycle_permutation(key, cycle, rows);
                            current = Some((cycle, permutation));
                            permutation
                        }
                    };
                    permutation.at(p % rows) as u32
                }))
            }
        }
    }

    /// The population row drawn at `position`.
    #[inline]
    pub fn row_at(self, table: &AliasTable, position: u64) -> usize {
        let rows = table.len().max(1) as u64;
        match self {
            StreamOrder::Sequential => (position % rows) as usize,
            StreamOrder::Weighted { key } => table.sample(word_at_key(key, position)),
            StreamOrder::Permuted { key } => {
                cycle_permutation(key, position / rows, rows).at(position % rows) as usize
            }
        }
    }
}

/// The permutation of cycle `cycle` of a stream whose key is `key`.
fn cycle_permutation(key: u64, cycle: u64, rows: u64) -> Permutation {
    Permutation::new(
        rows,
        mix64(key ^ mix64(cycle.wrapping_add(0x3C6E_F372_FE94_F82B))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::num::NonZeroU64;

    #[test]
    fn alias_table_matches_weights_within_five_sigma() {
        let weights = [1.0, 2.0, 3.0, 0.5, 10.0];
        let table = AliasTable::new(&weights).unwrap();
        let draws = 400_000u64;
        let mut counts = [0u64; 5];
        for k in 0..draws {
            counts[table.sample(word_at(7, k))] += 1;
        }
        let total: f64 = weights.iter().sum();
        for (i, &w) in weights.iter().enumerate() {
            let p = w / total;
            let expected = p * draws as f64;
            let sigma = (draws as f64 * p * (1.0 - p)).sqrt();
            let diff = (counts[i] as f64 - expected).abs();
            assert!(diff < 5.0 * sigma, "row {i}: {} vs {expected}", counts[i]);
        }
    }

    #[test]
    fn rejects_bad_totals() {
        assert!(AliasTable::new(&[]).is_err());
        assert!(AliasTable::new(&[f64::MAX, f64::MAX]).is_err());
    }

    #[test]
    fn sequential_order_cycles() {
        let table = AliasTable::new(&[1.0, 5.0, 1.0]).unwrap();
        let rows: Vec<usize> = (0..7)
            .map(|k| StreamOrder::Sequential.row_at(&table, k))
            .collect();
        assert_eq!(rows, vec![0, 1, 2, 0, 1, 2, 0]);
    }

    /// The rows of cycle `c` of a permutation stream over `rows` rows, batched.
    fn permuted_cycle(table: &AliasTable, seed: u64, cycle: u64) -> Vec<u32> {
        let rows = table.len() as u64;
        let mut out = Vec::new();
        let order = StreamOrder::new(ShuffleMode::Permutation, seed);
        order.rows_at(table, cycle * rows..(cycle + 1) * rows, &mut out);
        out
    }

    #[test]
    fn every_permutation_cycle_holds_every_row_once() {
        for rows in [1usize, 2, 3, 1000, 1009, (1 << 20) + 7] {
            // Weights are ignored in this mode: make them very unequal.
            let weights: Vec<f64> = (0..rows).map(|i| 1.0 + (i % 7) as f64 * 100.0).collect();
            let table = AliasTable::new(&weights).unwrap();
            let cycles: Vec<Vec<u32>> = (0..3).map(|c| permuted_cycle(&table, 11, c)).collect();
            for cycle in &cycles {
                let mut sorted = cycle.clone();
                sorted.sort_unstable();
                assert!(sorted.iter().copied().eq(0..rows as u32), "rows={rows}");
            }
            if rows >= 1000 {
                let identity: Vec<u32> = (0..rows as u32).collect();
                assert_ne!(cycles[0], cycles[1], "rows={rows}: cycles repeat");
                assert_ne!(cycles[1], cycles[2], "rows={rows}: cycles repeat");
                assert!(
                    cycles.iter().all(|c| *c != identity),
                    "rows={rows}: identity"
                );
                assert_ne!(
                    cycles[0],
                    permuted_cycle(&table, 12, 0),
                    "rows={rows}: seeds"
                );
            } else if rows > 1 {
                // Few orders exist: over many cycles, every one of them occurs.
                let orders: std::collections::HashSet<Vec<u32>> =
                    (0..200).map(|c| permuted_cycle(&table, 11, c)).collect();
                assert_eq!(orders.len(), if rows == 2 { 2 } else { 6 }, "rows={rows}");
            }
        }
    }

    /// Pearson's chi-square of `counts` against a uniform expectation, and
    /// whether it lies within 5 standard deviations of its mean (`df`; sd `sqrt(2 df)`).
    fn uniform_within_five_sigma(counts: &[u64]) -> (f64, bool) {
        let total: u64 = counts.iter().sum();
        let expected = total as f64 / counts.len() as f64;
        let chi2: f64 = counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        let df = (counts.len() - 1) as f64;
        (chi2, (chi2 - df).abs() < 5.0 * (2.0 * df).sqrt())
    }

    #[test]
    fn over_seeds_a_row_lands_anywhere_and_pairs_are_unbiased() {
        for rows in [3usize, 10, 1009] {
            let table = AliasTable::new(&vec![1.0; rows]).unwrap();
            let mut where_row_0 = vec![0u64; rows];
            let mut pairs = vec![0u64; rows * rows];
            let seeds = if rows > 100 { 2_000 } else { 20_000 };
            for seed in 0..seeds {
                let cycle = permuted_cycle(&table, seed, seed % 5);
                let at = cycle.iter().position(|&r| r == 0).unwrap();
                where_row_0[at] += 1;
                if rows <= 10 {
                    for pair in cycle.windows(2) {
                        pairs[pair[0] as usize * rows + pair[1] as usize] += 1;
                    }
                }
            }
            let (chi2, ok) = uniform_within_five_sigma(&where_row_0);
            assert!(ok, "rows={rows}: row 0's position chi2={chi2}");
            if rows <= 10 {
                // Ordered pairs of distinct rows (a row never follows itself in a cycle).
                let distinct: Vec<u64> = (0..rows * rows)
                    .filter(|i| i / rows != i % rows)
                    .map(|i| pairs[i])
                    .collect();
                let (chi2, ok) = uniform_within_five_sigma(&distinct);
                assert!(ok, "rows={rows}: adjacent pairs chi2={chi2}");
            }
        }
    }

    #[test]
    fn a_permutation_position_is_the_same_alone_or_batched() {
        let table = AliasTable::new(&[1.0; 1000]).unwrap();
        let order = StreamOrder::new(ShuffleMode::Permutation, 3);
        for start in [0u64, 999, 1_000_000_000_000, u64::MAX - 1500] {
            let mut batched = Vec::new();
            order.rows_at(&table, start..start + 1500, &mut batched);
            for (i, &row) in batched.iter().enumerate() {
                assert_eq!(order.row_at(&table, start + i as u64), row as usize);
            }
        }
    }

    #[test]
    fn shuffle_keys_parse_and_print_compatibly() {
        let parse = |text: &str| serde_json::from_str::<ShuffleMode>(text);
        assert_eq!(parse("true").unwrap(), ShuffleMode::Weighted);
        assert_eq!(parse("false").unwrap(), ShuffleMode::Ordered);
        assert_eq!(parse("\"permutation\"").unwrap(), ShuffleMode::Permutation);
        assert!(parse("\"random\"").is_err());
        assert!(parse("1").is_err());
        let print = |mode: ShuffleMode| serde_json::to_string(&mode).unwrap();
        assert_eq!(print(ShuffleMode::Weighted), "true");
        assert_eq!(print(ShuffleMode::Permutation), "\"permutation\"");
    }

    #[test]
    fn partition_remainder_is_dropped_evenly() {
        let w = StreamWindow::new(100, 10, 1).unwrap();
        let parts: Vec<Vec<u64>> = (0..3)
            .map(|r| {
                let p = Partition::new(r, 3, 0).unwrap().of(&w).unwrap();
                (0..p.count).map(|i| p.position(i)).collect()
            })
            .collect();
        assert_eq!(parts[0], vec![100, 103, 106]);
        assert_eq!(parts[1], vec![101, 104, 107]);
        assert_eq!(parts[2], vec![102, 105, 108]);
        assert!(Partition::new(3, 3, 0).is_err());
    }

    /// The partition rule as docs/sampling.md states it, position by position.
    fn rule(
        epoch: u64,
        len: u64,
        rank: u64,
        w: u64,
        start: u64,
        stop: u64,
        block: u64,
    ) -> Vec<u64> {
        let blocks = (stop - start) / block;
        let per_rank = blocks / w * block;
        (0..per_rank)
            .map(|i| epoch * len + start + (rank + i / block * w) * block + i % block)
            .collect()
    }

    fn read(p: Partition, epoch: u64, len: u64) -> Vec<u64> {
        let window = p
            .of(&StreamWindow::epoch(epoch, NonZeroU64::new(len).unwrap()).unwrap())
            .unwrap();
        let walked: Vec<u64> = window.positions(0, window.count).collect();
        let indexed: Vec<u64> = (0..window.count).map(|i| window.position(i)).collect();
        assert_eq!(walked, indexed);
        walked
    }

    fn part(rank: u64, w: u64, offset: u64, start: u64, stop: u64, block: u64) -> Partition {
        Partition::new(rank, w, offset)
            .unwrap()
            .range(start, Some(stop))
            .blocks(NonZeroU64::new(block).unwrap())
    }

    #[test]
    fn blocks_follow_the_rule() {
        // L = 20, start = 3, block = 2, w = 3: 17 positions, 8 blocks, 2 per rank.
        let ranks: Vec<Vec<u64>> = (0..3)
            .map(|r| read(part(r, 3, 0, 3, 20, 2), 1, 20))
            .collect();
        assert_eq!(ranks[0], vec![23, 24, 29, 30]);
        assert_eq!(ranks[1], vec![25, 26, 31, 32]);
        assert_eq!(ranks[2], vec![27, 28, 33, 34]);
        // An offset inside a block starts mid-block.
        assert_eq!(read(part(1, 3, 1, 3, 20, 2), 1, 20), vec![26, 31, 32]);
    }

    #[test]
    fn range_errors_name_the_keys() {
        let epoch = StreamWindow::epoch(0, NonZeroU64::new(10).unwrap()).unwrap();
        for p in [
            part(0, 1, 0, 11, 10, 1),
            part(0, 1, 0, 0, 11, 1),
            part(0, 1, 0, 5, 4, 1),
        ] {
            let message = p.of(&epoch).unwrap_err().to_string();
            assert!(
                message.contains("'start'") && message.contains("epoch_len=10"),
                "{message}"
            );
        }
        let huge = part(1, 2, 0, 0, u64::MAX, u64::MAX / 2);
        assert!(huge.of(&StreamWindow::new(0, u64::MAX, 1).unwrap()).is_ok());
    }

    proptest! {
        #[test]
        fn partitions_are_disjoint_equal_and_cover_the_rule(
            epoch in 0u64..4, len in 1u64..300, w in 1u64..9, block in 1u64..12,
            start_frac in 0.0f64..=1.0, stop_frac in 0.0f64..=1.0,
        ) {
            let stop = ((len as f64) * stop_frac) as u64;
            let start = ((stop as f64) * start_frac) as u64;
            let parts: Vec<Vec<u64>> =
                (0..w).map(|r| read(part(r, w, 0, start, stop, block), epoch, len)).collect();
            let per_rank = (stop - start) / block / w * block;
            let mut all = Vec::new();
            for (r, p) in parts.iter().enumerate() {
                prop_assert_eq!(p, &rule(epoch, len, r as u64, w, start, stop, block));
                prop_assert_eq!(p.len() as u64, per_rank);
                all.extend_from_slice(p);
            }
            all.sort_unstable();
            let first = epoch * len + start;
            let covered: Vec<u64> = (first..first + w * per_rank).collect();
            prop_assert_eq!(all, covered);
        }

        #[test]
        fn start_chaining_equals_one_read(
            len in 1u64..400, w in 1u64..6, block in 1u64..9, start in 0u64..50, m in 0u64..20,
        ) {
            let start = start.min(len);
            for rank in 0..w {
                let whole = read(part(rank, w, 0, start, len, block), 2, len);
                let taken = (m * block).min(whole.len() as u64);
                let resumed_at = start + taken / block * w * block;
                let tail = read(part(rank, w, 0, resumed_at, len, block), 2, len);
                let mut chained = whole[..taken as usize].to_vec();
                chained.extend(tail);
                prop_assert_eq!(chained, whole);
            }
        }

        #[test]
        fn offsets_skip_inside_blocks(
            len in 1u64..300, w in 1u64..6, block in 1u64..9, offset in 0u64..80,
        ) {
            for rank in 0..w {
                let whole = read(part(rank, w, 0, 0, len, block), 0, len);
                let skipped = read(part(rank, w, offset, 0, len, block), 0, len);
                let skip = (offset as usize).min(whole.len());
                prop_assert_eq!(&whole[skip..], &skipped[..]);
            }
        }

        #[test]
        fn batched_draws_equal_single_draws(seed: u64, start in 0u64..1_000_000, n in 0usize..200) {
            let weights: Vec<f64> = (1..300).map(|i| (i % 17 + 1) as f64).collect();
            let table = AliasTable::new(&weights).unwrap();
            for order in [
                StreamOrder::new(ShuffleMode::Weighted, seed),
                StreamOrder::new(ShuffleMode::Permutation, seed),
                StreamOrder::Sequential,
            ] {
                let mut many = Vec::new();
                order.rows_at(&table, start..start + n as u64, &mut many);
                let single: Vec<u32> = (start..start + n as u64)
                    .map(|p| order.row_at(&table, p) as u32)
                    .collect();
                prop_assert_eq!(many, single);
            }
        }

        #[test]
        fn draws_are_pure_functions_of_seed_and_position(seed: u64, k in 0u64..1_000_000) {
            let weights: Vec<f64> = (1..50).map(|i| i as f64).collect();
            let a = AliasTable::new(&weights).unwrap();
            let b = AliasTable::new(&weights).unwrap();
            let order = StreamOrder::new(ShuffleMode::Weighted, seed);
            prop_assert_eq!(order.row_at(&a, k), order.row_at(&b, k));
            prop_assert!(order.row_at(&a, k) < weights.len());
        }

        #[test]
        fn offsets_resume_partitions(count in 0u64..500, world in 1u64..8, offset in 0u64..100) {
            let w = StreamWindow::new(17, count, 1).unwrap();
            for rank in 0..world {
                let full = Partition::new(rank, world, 0).unwrap().of(&w).unwrap();
                let tail = Partition::new(rank, world, offset).unwrap().of(&w).unwrap();
                let full: Vec<u64> = (0..full.count).map(|i| full.position(i)).collect();
                let tail: Vec<u64> = (0..tail.count).map(|i| tail.position(i)).collect();
                let skip = (offset as usize).min(full.len());
                prop_assert_eq!(&full[skip..], &tail[..]);
            }
        }
    }
}
