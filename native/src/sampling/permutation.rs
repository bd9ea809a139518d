//! Pseudo-random permutations of `[0, n)` computed one element at a time.
//!
//! `Permutation::at(i)` is `pi(i)` for a permutation `pi` of `[0, n)` chosen by a
//! 64-bit key, in O(1) time and memory: nothing is materialised or sorted. The
//! construction is a keyed Feistel network on `b`-bit integers, where `2^b` is
//! the smallest power of two `>= n`, made to stay inside `[0, n)` by cycle
//! walking (apply the network again until the value falls below `n`).
//!
//! - **Feistel network.** A `b`-bit value is split into a left part of
//!   `ceil(b/2)` bits and a right part of `floor(b/2)` bits. A round maps
//!   `(L, R)` to `(R, L xor F_k(R))`, with `F_k` the round's keyed hash cut to
//!   the width of `L`; the parts swap widths each round. Each round is a
//!   bijection whatever `F_k` is (its inverse is `(L', R') -> (R' xor F_k(L'), L')`),
//!   so the network is a bijection of `[0, 2^b)`. With a hash that behaves as a
//!   random function, four rounds already give a pseudo-random permutation
//!   (Luby-Rackoff); we use `ROUNDS = 8` for margin at small widths, where one
//!   part may be a single bit.
//! - **Cycle walking.** Following `x -> net(x)` from `i < n` until the value is
//!   below `n` is a bijection of `[0, n)` (the restriction of a permutation to a
//!   subset along its cycles). Since `2^b < 2n`, more than half the values are
//!   in range, so a walk takes fewer than 2 steps on average and `k` or more
//!   with probability at most `2^-(k-1)`.
//!
//! The round function is SplitMix64's mixer (`mix64`) of the right part xor the
//! round key; round keys are derived from the key by the same mixer.

use super::mix64;

/// Rounds of the Feistel network (even, so the parts end at their original widths).
pub const ROUNDS: usize = 8;

/// Largest domain: `n <= 2^MAX_BITS` (populations are far smaller; this bounds
/// the shifts below).
pub const MAX_BITS: u32 = 62;

const ROUND_GAMMA: u64 = 0xD1B5_4A32_D192_ED03;

/// A keyed permutation of `[0, n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    /// Width of the left part at the start (`ceil(bits / 2)`), and of the right.
    left_bits: u32,
    right_bits: u32,
    round_keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `[0, n)` of `key` (`1 <= n <= 2^MAX_BITS`).
    pub fn new(n: u64, key: u64) -> Self {
        assert!(
            (1..=1 << MAX_BITS).contains(&n),
            "a permutation domain is 1..=2^{MAX_BITS}, got {n}"
        );
        let bits = u64::BITS - (n - 1).leading_zeros(); // 2^bits >= n, bits = 0 for n = 1
        let mut round_keys = [0u64; ROUNDS];
        for (round, slot) in round_keys.iter_mut().enumerate() {
            *slot = mix64(key ^ (round as u64 + 1).wrapping_mul(ROUND_GAMMA));
        }
        Permutation {
            n,
            left_bits: bits - bits / 2,
            right_bits: bits / 2,
            round_keys,
        }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// `pi(i)` for `i < n`.
    #[inline]
    pub fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n, "{i} is outside [0, {})", self.n);
        let mut x = self.network(i);
        while x >= self.n {
            x = self.network(x);
        }
        x
    }

    /// One pass of the Feistel network over `[0, 2^bits)`.
    #[inline]
    fn network(&self, x: u64) -> u64 {
        let (mut left_bits, mut right_bits) = (self.left_bits, self.right_bits);
        let mut left = x >> right_bits;
        let mut right = x & mask(right_bits);
        for key in self.round_keys {
            let f = mix64(right ^ key) & mask(left_bits);
            (left, right) = (right, left ^ f);
            (left_bits, right_bits) = (right_bits, left_bits);
        }
        (left << right_bits) | right
    }
}

#[inline]
fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1 // bits <= MAX_BITS / 2 + 1 < 64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(n: u64, key: u64) -> Vec<u64> {
        let p = Permutation::new(n, key);
        (0..n).map(|i| p.at(i)).collect()
    }

    fn is_permutation(values: &[u64]) -> bool {
        let mut seen = vec![false; values.len()];
        values.iter().all(|&v| {
            let fresh = (v as usize) < seen.len() && !seen[v as usize];
            if fresh {
                seen[v as usize] = true;
            }
            fresh
        })
    }

    #[test]
    fn every_domain_size_is_permuted() {
        for n in (1..=300).chain([1000, 1021, 4096, 4097, (1 << 20) + 7]) {
            for key in [0, 1, 0xDEAD_BEEF, u64::MAX] {
                assert!(is_permutation(&image(n, key)), "n={n} key={key}");
            }
        }
    }

    #[test]
    fn keys_choose_different_permutations() {
        for n in [3u64, 10, 1000, (1 << 20) + 7] {
            let first = image(n, 1);
            assert_ne!(first, image(n, 2), "n={n}");
            assert_ne!(first, (0..n).collect::<Vec<_>>(), "n={n}: identity");
        }
        // Two elements: both orders occur among keys.
        let orders: std::collections::HashSet<Vec<u64>> = (0..64).map(|k| image(2, k)).collect();
        assert_eq!(orders.len(), 2);
    }

    #[test]
    fn the_largest_domains_stay_in_range() {
        for n in [1u64 << 40, (1 << 40) - 3, 1 << MAX_BITS] {
            let p = Permutation::new(n, 7);
            let mut values: Vec<u64> = [0, 1, 2, n / 2, n - 2, n - 1]
                .iter()
                .map(|&i| p.at(i))
                .collect();
            assert!(values.iter().all(|&v| v < n));
            values.sort_unstable();
            values.dedup();
            assert_eq!(values.len(), 6, "distinct inputs, distinct outputs");
        }
    }

    #[test]
    #[should_panic(expected = "a permutation domain")]
    fn an_empty_domain_is_refused() {
        Permutation::new(0, 1);
    }
}
