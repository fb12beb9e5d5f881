//! A communicator that counts the bytes its rank sends: what each collective costs on a
//! network, by the ring algorithms NCCL and MPI run (Thakur et al. 2005; Patarasuk & Yuan
//! 2009), whatever the wrapped communicator does underneath (threads share memory). The
//! count is what `plait run --log-json` reports as `comm_bytes`, and what gradient
//! compression and local SGD are measured by.
//!
//! Per call, with n ranks and elements of 4 bytes (f32): all-reduce of L elements 2·(n−1)/n·L;
//! all-gather of L each (n−1)·L; reduce-scatter to L each (n−1)·L; all-to-all of L
//! (n−1)/n·L; broadcast of L (n−1)/n·L (pipelined through the ring); a send L; a receive 0.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Communicator;
use crate::RuntimeError;

/// Bytes per element on the wire: the runtime's f32.
const ELEM: u64 = 4;

/// `inner`, counting into `sent` (shared with every subgroup it creates).
#[derive(Debug)]
pub struct Counted<C> {
    inner: C,
    sent: Arc<AtomicU64>,
}

impl<C: Communicator> Counted<C> {
    pub fn new(inner: C) -> Counted<C> {
        Counted {
            inner,
            sent: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes this rank has sent so far, on this communicator and its subgroups.
    pub fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// The shared counter, to read while the communicator is lent out.
    pub fn sent_bytes_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.sent)
    }

    fn add(&self, elements: f64) {
        let bytes = (elements * ELEM as f64).round() as u64;
        self.sent.fetch_add(bytes, Ordering::Relaxed);
    }

    fn ring(&self) -> f64 {
        let n = self.inner.size() as f64;
        (n - 1.0) / n
    }
}

impl<C: Communicator> Communicator for Counted<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn world_ranks(&self) -> &[usize] {
        self.inner.world_ranks()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }

    fn group(&self, ranks: &[usize]) -> Result<Self, RuntimeError> {
        Ok(Counted {
            inner: self.inner.group(ranks)?,
            sent: Arc::clone(&self.sent),
        })
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), RuntimeError> {
        self.add(2.0 * self.ring() * buf.len() as f64);
        self.inner.all_reduce_sum(buf)
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        self.add((self.inner.size() - 1) as f64 * send.len() as f64);
        self.inner.all_gather(send, recv)
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        self.add((self.inner.size() - 1) as f64 * recv.len() as f64);
        self.inner.reduce_scatter_sum(send, recv)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), RuntimeError> {
        self.add(self.ring() * buf.len() as f64);
        self.inner.broadcast(buf, root)
    }

    fn all_to_all(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        self.add(self.ring() * send.len() as f64);
        self.inner.all_to_all(send, recv)
    }

    fn send(&self, buf: &[f32], dest: usize, tag: u32) -> Result<(), RuntimeError> {
        self.add(buf.len() as f64);
        self.inner.send(buf, dest, tag)
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<(), RuntimeError> {
        self.inner.recv(buf, src, tag)
    }

    fn barrier(&self) -> Result<(), RuntimeError> {
        self.inner.barrier()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;

    #[test]
    fn a_two_rank_all_reduce_sends_the_buffer_once() {
        let comms = ThreadComm::world(2);
        let sent: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let c = Counted::new(c);
                        let mut buf = vec![1.0f32; 1000];
                        c.all_reduce_sum(&mut buf).expect("all-reduce");
                        assert_eq!(buf[0], 2.0);
                        let g = c.group(&[0, 1]).expect("group");
                        let mut out = vec![0.0f32; 2000];
                        g.all_gather(&buf, &mut out).expect("all-gather");
                        c.sent_bytes()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        // Ring all-reduce with n = 2: 2·(1/2)·1000 elements; the subgroup's all-gather adds
        // 1000 more to the same counter.
        assert_eq!(sent, vec![8000, 8000]);
    }
}
