//! What the engine asks of the operating system beyond `std`, in one place.
//!
//! Each function names its Linux implementation and the fallback used
//! elsewhere (`cfg(target_os = "linux")`): the engine is built and tested on
//! Linux; on other Unix systems it builds with the fallbacks, which are
//! correct and slower.

mod alloc;

pub use alloc::allocate;
