//! Payload buffers reused across the batches of one stream.
//!
//! A batch of large records needs megabytes of payload buffer. Allocated
//! afresh, that is fresh memory from the kernel, which faults in and zeroes
//! every page of it before the records are copied over it (10% of the CPU of
//! a per-sample epoch of 1 MiB records). A buffer the consumer has dropped is
//! already resident: the pool takes it back, and the next batch reuses it.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use arrow_buffer::Buffer;

/// Buffers smaller than this come from the allocator's free lists, whose
/// memory stays resident anyway: not worth pooling.
const MIN_POOLED: usize = 256 << 10;

/// Buffers the pool keeps for reuse (beyond these, a returned buffer is freed):
/// enough for the batches in flight between the workers and the consumer, so
/// that an idle stream holds at most this many batches of memory.
const KEEP: usize = 4;

#[derive(Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// An empty buffer of at least `capacity` bytes: a returned one if one is
    /// large enough, else a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity >= MIN_POOLED {
            if let Ok(mut free) = self.free.lock() {
                if let Some(at) = free.iter().position(|b| b.capacity() >= capacity) {
                    return free.swap_remove(at);
                }
            }
        }
        Vec::with_capacity(capacity)
    }

    /// `values` as an Arrow buffer that comes back to this pool when Arrow
    /// (in this process or across the C data interface) drops the last
    /// reference to it.
    pub fn share(self: &Arc<Self>, mut values: Vec<u8>) -> Buffer {
        if values.capacity() < MIN_POOLED {
            return Buffer::from_vec(values);
        }
        let len = values.len();
        let Some(ptr) = NonNull::new(values.as_mut_ptr()) else {
            return Buffer::from_vec(values);
        };
        let owner = Arc::new(Pooled {
            values,
            pool: Arc::downgrade(self),
        });
        // SAFETY: `ptr` points at `len` initialised bytes of the vector that
        // `owner` holds; the vector is never touched again until `owner` is
        // dropped, when no Arrow buffer refers to it any more. Moving a Vec
        // does not move its heap allocation.
        unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
    }

    fn give_back(&self, mut values: Vec<u8>) {
        values.clear();
        if let Ok(mut free) = self.free.lock() {
            if free.len() < KEEP {
                free.push(values);
            }
        }
    }
}

/// The owner of a shared buffer's memory.
struct Pooled {
    values: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.values));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused() {
        let pool = Arc::new(BufferPool::default());
        let mut values = pool.take(1 << 20);
        values.extend(std::iter::repeat_n(7u8, 1 << 20));
        let address = values.as_ptr();
        let buffer = pool.share(values);
        assert_eq!(buffer.len(), 1 << 20);
        assert!(buffer.as_slice().iter().all(|&b| b == 7));
        // Still referenced (a slice of it too): nothing to reuse yet.
        let part = buffer.slice(10);
        drop(buffer);
        assert!(pool.free.lock().unwrap().is_empty());
        drop(part);
        let again = pool.take(1000 << 10);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
    }

    #[test]
    fn small_buffers_and_an_ended_pool_free_memory() {
        let pool = Arc::new(BufferPool::default());
        let small = pool.share(vec![1, 2, 3]);
        assert_eq!(small.as_slice(), &[1, 2, 3]);
        let large = pool.share(vec![0; 1 << 20]);
        drop(pool);
        drop(large); // the pool is gone: the memory is freed, nothing panics
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers() {
        let pool = Arc::new(BufferPool::default());
        let buffers: Vec<Buffer> = (0..KEEP + 3)
            .map(|_| pool.share(vec![0; MIN_POOLED]))
            .collect();
        drop(buffers);
        assert_eq!(pool.free.lock().unwrap().len(), KEEP);
    }
}
