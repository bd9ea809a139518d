//! `Slab<T>`: a read-only slice of plain values whose memory something else
//! owns, a section of a mapped file or a `Vec`. The population's identities,
//! weights and alias table are slabs over its mapped rows file, so serving a
//! population costs page cache (the kernel's to reclaim), not process memory;
//! tests and small tables build the same types from vectors.

use std::any::Any;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;

use crate::os::mapped::MappedFile;

/// Values that may be read from a file's bytes as they are: `Copy`, no
/// padding, every bit pattern valid, little-endian on every supported target.
///
/// # Safety
/// Implement only for types for which any initialised bytes of the right
/// size and alignment are a valid value.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

// SAFETY: integers and floats take any bit pattern.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for u64 {}
// SAFETY: as above.
unsafe impl Plain for f64 {}

pub struct Slab<T: Plain> {
    ptr: NonNull<T>,
    len: usize,
    /// Keeps the memory `ptr` points into alive.
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: a slab is an immutable view of memory its owner keeps alive; `T`
// is `Send + Sync` plain data.
unsafe impl<T: Plain> Send for Slab<T> {}
// SAFETY: as above.
unsafe impl<T: Plain> Sync for Slab<T> {}

impl<T: Plain> Slab<T> {
    pub fn from_vec(values: Vec<T>) -> Self {
        let owner = Arc::new(values);
        let (ptr, len) = (owner.as_ptr(), owner.len());
        Slab {
            // A Vec's pointer is never null (dangling but aligned when empty).
            ptr: NonNull::new(ptr.cast_mut()).unwrap_or(NonNull::dangling()),
            len,
            _owner: owner,
        }
    }

    /// `len` values at byte `offset` of `map`, or why they cannot be read
    /// there (out of the file, misaligned).
    pub fn mapped(
        map: &Arc<MappedFile>,
        offset: usize,
        len: usize,
    ) -> std::result::Result<Self, String> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .and_then(|b| b.checked_add(offset))
            .ok_or_else(|| format!("a section of {len} values at {offset} overflows"))?;
        if bytes > map.len() {
            return Err(format!(
                "a section of {len} values ends at byte {bytes}, past the end of the file \
                 ({} bytes): the file is truncated",
                map.len()
            ));
        }
        let start = map.as_ptr().wrapping_add(offset);
        if !(start as usize).is_multiple_of(align_of::<T>()) {
            return Err(format!("the section at byte {offset} is misaligned"));
        }
        Ok(Slab {
            ptr: NonNull::new(start.cast::<T>().cast_mut()).unwrap_or(NonNull::dangling()),
            len,
            _owner: map.clone(),
        })
    }
}

impl<T: Plain> Clone for Slab<T> {
    /// Another view of the same memory.
    fn clone(&self) -> Self {
        Slab {
            ptr: self.ptr,
            len: self.len,
            _owner: self._owner.clone(),
        }
    }
}

impl<T: Plain> std::fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slab of {} values", self.len)
    }
}

impl<T: Plain> Deref for Slab<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is aligned, valid for `len` values (checked when the
        // slab was made) and kept alive by `_owner`; `T` is plain data.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// Bytes `offset..offset + len` of `map` as an Arrow buffer, without a copy
/// (the buffer keeps the mapping alive).
pub fn arrow_buffer(map: &Arc<MappedFile>, offset: usize, len: usize) -> Option<Buffer> {
    if offset.checked_add(len)? > map.len() {
        return None;
    }
    if len == 0 {
        return Some(Buffer::from_vec(Vec::<u8>::new()));
    }
    let ptr = NonNull::new(map.as_ptr().wrapping_add(offset).cast_mut())?;
    // SAFETY: `ptr..ptr + len` lies inside the mapping, which the owner keeps
    // alive for as long as the buffer lives.
    Some(unsafe { Buffer::from_custom_allocation(ptr, len, map.clone()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn slabs_read_vectors_and_mapped_sections_alike() {
        let values: Vec<u64> = (0..100).collect();
        assert_eq!(&*Slab::from_vec(values.clone()), &values[..]);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[0u8; 8]).unwrap();
        for v in &values {
            file.write_all(&v.to_le_bytes()).unwrap();
        }
        let map = Arc::new(MappedFile::map(&file).unwrap());
        assert_eq!(&*Slab::<u64>::mapped(&map, 8, 100).unwrap(), &values[..]);
        assert!(Slab::<u64>::mapped(&map, 8, 101)
            .unwrap_err()
            .contains("truncated"));
        assert!(Slab::<u64>::mapped(&map, 4, 1)
            .unwrap_err()
            .contains("misaligned"));
        let buffer = arrow_buffer(&map, 8, 16).unwrap();
        assert_eq!(buffer.typed_data::<u64>(), &[0, 1]);
        assert!(arrow_buffer(&map, 800, 16).is_none());
    }
}
