//! A caching device allocator in the manner of PyTorch's `CUDACachingAllocator`: a freed
//! buffer's memory goes back to a free list, not to the driver, and a later request of about
//! its size takes it again, so a training step allocates from the driver only in its first
//! iteration. Sizes are rounded as PyTorch rounds them (`kMinBlockSize` 512 bytes; requests
//! above `kSmallSize` 1 MiB to multiples of `kRoundLarge` 2 MiB; c10/cuda/
//! CUDACachingAllocator.cpp), and a request reuses a cached block at most twice its size
//! (PyTorch splits larger blocks; this pool does not, so it bounds the waste instead).
//! When the driver is out of memory the pool hands every cached block back and tries once
//! more, as PyTorch does before raising an out-of-memory error. A block goes back to the cache
//! when its [`Pooled`] handle drops, however the buffer that held it ends (freed by the
//! executor, overwritten in its slot, or a temporary of an op): never to the driver, whose
//! stream-ordered pool would otherwise hand the memory back at the next synchronization and
//! map it afresh on the next request.
//!
//! [`MemoryStats`] keeps the high-water marks `plait run` compares with the plan's peak:
//! bytes in live buffers (PyTorch's `max_memory_allocated`) and bytes held from the driver
//! (`max_memory_reserved`).

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

/// Memory one device allocation holds.
pub trait Slab {
    /// Its size in bytes.
    fn bytes(&self) -> usize;
}

/// What a pool holds, and held at most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in buffers now live (their rounded sizes, not the sizes of the cached blocks
    /// that serve them).
    pub in_use: u64,
    /// The most `in_use` has been.
    pub peak_in_use: u64,
    /// Bytes held from the driver: live buffers and cached blocks.
    pub reserved: u64,
    pub peak_reserved: u64,
    /// Allocations from the driver, and requests served from the cache.
    pub driver_allocs: u64,
    pub reuses: u64,
}

/// Bytes a request of `bytes` takes.
pub fn rounded(bytes: usize) -> usize {
    const MIN_BLOCK: usize = 512;
    const SMALL: usize = 1 << 20;
    const ROUND_LARGE: usize = 2 << 20;
    let bytes = bytes.max(1);
    if bytes <= SMALL {
        bytes.next_multiple_of(MIN_BLOCK)
    } else {
        bytes.next_multiple_of(ROUND_LARGE)
    }
}

struct State<S> {
    /// Cached blocks by size.
    free: BTreeMap<usize, Vec<S>>,
    stats: MemoryStats,
}

/// A caching allocator over blocks of type `S` (a device allocation), shared by the
/// buffers it hands out.
pub struct Pool<S> {
    state: Arc<Mutex<State<S>>>,
}

impl<S> std::fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Pool")
            .field("stats", &st.stats)
            .finish_non_exhaustive()
    }
}

impl<S> Clone for Pool<S> {
    fn clone(&self) -> Self {
        Pool {
            state: Arc::clone(&self.state),
        }
    }
}

impl<S> Default for Pool<S> {
    fn default() -> Self {
        Pool {
            state: Arc::new(Mutex::new(State {
                free: BTreeMap::new(),
                stats: MemoryStats::default(),
            })),
        }
    }
}

/// A block handed out by [`Pool::take`]: its size counts as in use until the lease drops.
struct Lease<S> {
    state: Arc<Mutex<State<S>>>,
    /// The request's rounded size (in use while the lease lives).
    bytes: usize,
    /// The block's size (reserved from the driver).
    block: usize,
    /// The block came from the cache (it holds an earlier buffer's values).
    reused: bool,
    /// Whether the block went back to the pool ([`Pool::give`]) rather than to the driver.
    cached: bool,
}

impl<S> std::fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("bytes", &self.bytes)
            .field("block", &self.block)
            .finish()
    }
}

impl<S> Drop for Lease<S> {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.stats.in_use -= self.bytes as u64;
        if !self.cached {
            // The block itself was dropped: its memory went back to the driver.
            st.stats.reserved -= self.block as u64;
        }
    }
}

/// A block on loan from a [`Pool`]: it dereferences to the device allocation, and dropping it
/// caches the allocation for later requests.
pub struct Pooled<S: Slab> {
    slab: ManuallyDrop<S>,
    lease: Lease<S>,
}

impl<S: Slab> Pooled<S> {
    /// Whether the block came from the cache: it holds an earlier buffer's values (a fresh
    /// block from the driver is as the driver made it).
    pub fn reused(&self) -> bool {
        self.lease.reused
    }
}

impl<S: Slab> Deref for Pooled<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.slab
    }
}

impl<S: Slab> DerefMut for Pooled<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.slab
    }
}

impl<S: Slab> Drop for Pooled<S> {
    fn drop(&mut self) {
        // SAFETY: `slab` is taken once, here, and `self` is not used after `drop`.
        #[allow(unsafe_code)]
        let slab = unsafe { ManuallyDrop::take(&mut self.slab) };
        self.lease.cached = true;
        let mut st = self
            .lease
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        st.free.entry(slab.bytes()).or_default().push(slab);
        // The lease drops after this and takes its bytes out of `in_use`.
    }
}

impl<S: Slab> std::fmt::Debug for Pooled<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("bytes", &self.lease.bytes)
            .field("block", &self.lease.block)
            .finish()
    }
}

impl<S: Slab> Pool<S> {
    pub fn new() -> Pool<S> {
        Pool::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A block of at least `bytes` (rounded, [`rounded`]): a cached one of at most twice
    /// that, else a new one from `driver(size)`; if the driver fails, once more after
    /// handing every cached block back.
    pub fn take<E>(
        &self,
        bytes: usize,
        mut driver: impl FnMut(usize) -> Result<S, E>,
    ) -> Result<Pooled<S>, E> {
        let size = rounded(bytes);
        let cached = {
            let mut st = self.lock();
            let hit = st
                .free
                .range_mut(size..=size.saturating_mul(2))
                .find_map(|(&k, v)| v.pop().map(|s| (k, s)));
            if hit.is_some() {
                st.stats.reuses += 1;
            }
            st.free.retain(|_, v| !v.is_empty());
            hit
        };
        let reused = cached.is_some();
        let (block, slab) = match cached {
            Some(hit) => hit,
            None => {
                let slab = match driver(size) {
                    Ok(s) => s,
                    Err(_) => {
                        drop(self.release_cached());
                        driver(size)?
                    }
                };
                let mut st = self.lock();
                st.stats.driver_allocs += 1;
                st.stats.reserved += slab.bytes() as u64;
                (slab.bytes(), slab)
            }
        };
        let mut st = self.lock();
        st.stats.in_use += size as u64;
        debug_assert!(block >= size);
        st.stats.peak_in_use = st.stats.peak_in_use.max(st.stats.in_use);
        st.stats.peak_reserved = st.stats.peak_reserved.max(st.stats.reserved);
        drop(st);
        let lease = Lease {
            state: Arc::clone(&self.state),
            bytes: size,
            block,
            reused,
            cached: false,
        };
        Ok(Pooled {
            slab: ManuallyDrop::new(slab),
            lease,
        })
    }

    /// Takes every cached block out of the pool (dropping them frees them).
    pub fn release_cached(&self) -> Vec<S> {
        let mut st = self.lock();
        let blocks: Vec<S> = std::mem::take(&mut st.free)
            .into_values()
            .flatten()
            .collect();
        let bytes: u64 = blocks.iter().map(|b| b.bytes() as u64).sum();
        st.stats.reserved -= bytes;
        blocks
    }

    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in device block of `n` bytes.
    #[derive(Debug, PartialEq)]
    struct Block(usize);

    impl Slab for Block {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    fn driver(allocs: &std::cell::Cell<u32>) -> impl FnMut(usize) -> Result<Block, ()> + '_ {
        |n| {
            allocs.set(allocs.get() + 1);
            Ok(Block(n))
        }
    }

    #[test]
    fn sizes_round_as_pytorch_rounds_them() {
        assert_eq!(rounded(0), 512);
        assert_eq!(rounded(513), 1024);
        assert_eq!(rounded(1 << 20), 1 << 20);
        assert_eq!(rounded((1 << 20) + 1), 2 << 20);
        assert_eq!(rounded((4 << 20) + 1), 6 << 20);
    }

    #[test]
    fn a_freed_block_serves_the_next_step_and_the_marks_hold_the_peak() {
        let pool = Pool::new();
        let allocs = std::cell::Cell::new(0);
        for _ in 0..3 {
            // One "step": two buffers live at once, then both freed.
            let a = pool.take(3000, driver(&allocs)).expect("a");
            let b = pool.take(1 << 20, driver(&allocs)).expect("b");
            drop(a);
            drop(b);
        }
        assert_eq!(allocs.get(), 2, "only the first step allocates");
        let s = pool.stats();
        assert_eq!((s.in_use, s.peak_in_use), (0, 3072 + (1 << 20)));
        assert_eq!(
            (s.reserved, s.peak_reserved),
            (3072 + (1 << 20), 3072 + (1 << 20))
        );
        assert_eq!((s.driver_allocs, s.reuses), (2, 4));
    }

    #[test]
    fn a_block_serves_requests_up_to_twice_smaller_and_no_smaller() {
        let pool = Pool::new();
        let allocs = std::cell::Cell::new(0);
        let a = pool.take(4096, driver(&allocs)).expect("a");
        assert!(!a.reused());
        drop(a);
        let b = pool.take(2048, driver(&allocs)).expect("b");
        assert_eq!((b.0, allocs.get()), (4096, 1), "half the size: reused");
        assert!(b.reused());
        let s = pool.stats();
        assert_eq!(
            (s.in_use, s.reserved),
            (2048, 4096),
            "in use: the request's size"
        );
        drop(b);
        let c = pool.take(1024, driver(&allocs)).expect("c");
        assert_eq!((c.0, allocs.get()), (1024, 2), "a quarter: a new block");
    }

    #[test]
    fn out_of_memory_hands_the_cache_back_and_retries_once() {
        let pool = Pool::new();
        let allocs = std::cell::Cell::new(0);
        let a = pool.take(512, driver(&allocs)).expect("a");
        drop(a);
        let mut tries = 0;
        let full = |n: usize| {
            tries += 1;
            if tries == 1 {
                Err("out of memory")
            } else {
                Ok(Block(n))
            }
        };
        let big = pool.take(1 << 22, full).expect("retried");
        assert_eq!((big.0, tries), (1 << 22, 2));
        assert_eq!(
            pool.stats().reserved,
            1 << 22,
            "the cached 512 bytes went back"
        );
        // A dropped buffer's block stays reserved, in the cache, until the cache is released.
        drop(big);
        assert_eq!((pool.stats().reserved, pool.stats().in_use), (1 << 22, 0));
        assert_eq!(pool.release_cached(), vec![Block(1 << 22)]);
        assert_eq!(pool.stats().reserved, 0);
    }
}
