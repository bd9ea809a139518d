//! Windows and partitions of a stream: which positions a window, a rank's
//! share of an epoch, or a resumed share reads (DESIGN.md, contract 4). The
//! one implementation of the partition rule, for both faces.

use std::num::NonZeroU64;

use crate::error::{Error, Result};

/// Most ranks one epoch can be split into (a larger world is refused before
/// any work starts).
pub const MAX_WORLD_SIZE: u64 = 1 << 32;

/// One rank's share of an epoch. The epoch-relative range `[start, stop)` is cut
/// into `floor((stop - start) / block)` blocks of `block` consecutive positions;
/// rank `r` of `w` takes blocks `r, r + w, r + 2w, ...`, `floor(blocks / w)` of
/// them, so sample `i = j * block + t` of rank `r` is epoch position
/// `start + (r + j * w) * block + t`. Every rank takes the same number; the
/// remainder goes to no rank. `offset` then skips the rank's first samples.
/// With `start = 0`, `stop = L` and `block = 1` this is every `w`-th position.
/// The one implementation of the partition rule, for both faces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    rank: u64,
    world_size: NonZeroU64,
    offset: u64,
    start: u64,
    stop: Option<u64>,
    block: NonZeroU64,
}

impl Partition {
    /// The whole window, from its first position.
    pub const WHOLE: Partition = Partition {
        rank: 0,
        world_size: NonZeroU64::MIN,
        offset: 0,
        start: 0,
        stop: None,
        block: NonZeroU64::MIN,
    };

    /// Rank `rank` of `world_size`, every `world_size`-th position, from `offset`.
    pub fn new(rank: u64, world_size: u64, offset: u64) -> Result<Self> {
        let world = NonZeroU64::new(world_size)
            .filter(|w| w.get() <= MAX_WORLD_SIZE)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "'world_size' must be between 1 and {MAX_WORLD_SIZE} (and 'rank' below it), \
                     got world_size={world_size} rank={rank}"
                ))
            })?;
        if rank >= world_size {
            return Err(Error::invalid(format!(
                "'rank' must be < 'world_size' ({world_size}), got {rank}"
            )));
        }
        Ok(Partition {
            rank,
            world_size: world,
            offset,
            ..Partition::WHOLE
        })
    }

    /// Partition only the epoch-relative range `[start, stop)` (`stop` defaults
    /// to the epoch length; both are checked against it in `of`).
    pub fn range(self, start: u64, stop: Option<u64>) -> Self {
        Partition {
            start,
            stop,
            ..self
        }
    }

    /// Cut the range into blocks of `block` consecutive positions.
    pub fn blocks(self, block: NonZeroU64) -> Self {
        Partition { block, ..self }
    }

    pub fn rank(&self) -> u64 {
        self.rank
    }
    pub fn world_size(&self) -> u64 {
        self.world_size.get()
    }
    pub fn offset(&self) -> u64 {
        self.offset
    }
    pub fn start(&self) -> u64 {
        self.start
    }
    pub fn stop(&self) -> Option<u64> {
        self.stop
    }
    pub fn block(&self) -> u64 {
        self.block.get()
    }

    /// Samples each rank receives of an epoch of `epoch_len` positions.
    pub fn per_rank(&self, epoch_len: u64) -> Result<u64> {
        let (start, stop) = self.bounds(epoch_len)?;
        let blocks = (stop - start) / self.block.get();
        Ok(blocks / self.world_size.get() * self.block.get())
    }

    /// `[start, stop)` checked against the epoch length.
    fn bounds(&self, epoch_len: u64) -> Result<(u64, u64)> {
        self.check_range(Some(epoch_len))?;
        Ok((self.start, self.stop.unwrap_or(epoch_len)))
    }

    /// Check `0 <= start <= stop <= epoch_len`, as far as the values are known.
    pub fn check_range(&self, epoch_len: Option<u64>) -> Result<()> {
        let stop = self.stop.or(epoch_len);
        let start_fits = stop.is_none_or(|stop| self.start <= stop);
        let stop_fits = match (self.stop, epoch_len) {
            (Some(stop), Some(len)) => stop <= len,
            _ => true,
        };
        if start_fits && stop_fits {
            return Ok(());
        }
        let show = |v: Option<u64>| v.map_or_else(|| "unset".to_string(), |v| v.to_string());
        Err(Error::invalid(format!(
            "'start' and 'stop' must satisfy 0 <= start <= stop <= epoch_len, \
             got start={} stop={} epoch_len={}",
            self.start,
            show(self.stop),
            show(epoch_len)
        )))
    }

    /// The positions of the contiguous `epoch` window this partition reads.
    pub fn of(&self, epoch: &StreamWindow) -> Result<StreamWindow> {
        if !epoch.is_contiguous() {
            return Err(Error::internal(format!(
                "a partition divides a contiguous epoch, got {epoch:?}"
            )));
        }
        let (start, _) = self.bounds(epoch.count)?;
        let per_rank = self.per_rank(epoch.count)?;
        let offset = self.offset.min(per_rank);
        if per_rank == offset {
            return Ok(StreamWindow::EMPTY);
        }
        // per_rank > 0, so w * block <= stop - start: the products below fit.
        let (block, world) = (self.block.get(), self.world_size.get());
        let stride = world * block;
        let first_block = epoch.start + start + self.rank * block;
        StreamWindow::blocked(first_block, per_rank, block, stride)?.skip(offset)
    }
}

/// A window of a stream: `count` positions taken as blocks of `block`
/// consecutive positions whose starts are `stride` apart, beginning `skip`
/// positions into the block at `start`. Position `i` is
/// `start + ((skip + i) / block) * stride + (skip + i) % block`; with
/// `block = 1` that is `start + i * stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamWindow {
    pub start: u64,
    pub count: u64,
    stride: u64,
    block: u64,
    skip: u64,
}

impl StreamWindow {
    pub const EMPTY: StreamWindow = StreamWindow {
        start: 0,
        count: 0,
        stride: 1,
        block: 1,
        skip: 0,
    };

    /// Positions `start + i * stride` for `i < count`.
    pub fn new(start: u64, count: u64, stride: u64) -> Result<Self> {
        if stride == 0 {
            return Err(Error::invalid("stride must be >= 1"));
        }
        StreamWindow::blocked(start, count, 1, stride)
    }

    /// `count` positions in blocks of `block`, block starts `stride` apart.
    fn blocked(start: u64, count: u64, block: u64, stride: u64) -> Result<Self> {
        let window = StreamWindow {
            start,
            count,
            stride,
            block,
            skip: 0,
        };
        window.check_last()?;
        Ok(window)
    }

    /// The same positions without the first `n` (`n <= count`).
    fn skip(self, n: u64) -> Result<Self> {
        let skipped = self.skip + n;
        let window = StreamWindow {
            start: self.start + skipped / self.block * self.stride,
            count: self.count - n,
            skip: skipped % self.block,
            ..self
        };
        window.check_last()?;
        Ok(window)
    }

    /// Refuse a window whose last position would pass 2**64 - 1.
    fn check_last(&self) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        let last = self.skip + self.count - 1;
        (last / self.block)
            .checked_mul(self.stride)
            .and_then(|d| d.checked_add(last % self.block))
            .and_then(|d| d.checked_add(self.start))
            .map(|_| ())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "the window of {} positions from {} (stride {}) runs past position 2**64 - 1",
                    self.count, self.start, self.stride
                ))
            })
    }

    /// Epoch `epoch` of length `epoch_len`: positions `[e * L, (e + 1) * L)`.
    pub fn epoch(epoch: u64, epoch_len: NonZeroU64) -> Result<Self> {
        let start = epoch.checked_mul(epoch_len.get()).ok_or_else(|| {
            Error::invalid(format!(
                "epoch {epoch} x epoch_len {epoch_len} is past the end of the stream \
                 (2**64 positions)"
            ))
        })?;
        StreamWindow::new(start, epoch_len.get(), 1)
    }

    fn is_contiguous(&self) -> bool {
        self.stride == self.block && self.skip == 0
    }

    /// Position `i` of the window (`i < count`).
    #[inline]
    pub fn position(&self, i: u64) -> u64 {
        let k = self.skip + i;
        if self.block == 1 {
            self.start + k * self.stride
        } else {
            self.start + k / self.block * self.stride + k % self.block
        }
    }

    /// Positions `first .. first + n` of the window, one division in all.
    pub fn positions(&self, first: u64, n: u64) -> Positions {
        let k = self.skip + first;
        Positions {
            next: self.start + k / self.block * self.stride + k % self.block,
            left_in_block: self.block - k % self.block,
            remaining: n,
            block: self.block,
            jump: self.stride - self.block + 1,
        }
    }
}

/// The positions of a window range, walked block by block.
#[derive(Debug, Clone)]
pub struct Positions {
    next: u64,
    left_in_block: u64,
    remaining: u64,
    block: u64,
    /// From a block's last position to the next block's first.
    jump: u64,
}

impl Iterator for Positions {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        let position = self.next;
        self.remaining -= 1;
        self.left_in_block -= 1;
        if self.left_in_block == 0 {
            self.left_in_block = self.block;
            // Past the window's last position this may wrap; it is never read.
            self.next = position.wrapping_add(self.jump);
        } else {
            self.next = position.wrapping_add(1);
        }
        Some(position)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}
