//! Waiting on a device with a deadline. A GPU rank's queued work can wait forever: an NCCL
//! collective whose peer died or hung never completes, and neither does anything queued
//! after it, so a blocking stream synchronize would hang the rank with no word. The device
//! backend instead polls its queue's completion ([`wait_until`]) and gives up at the deadline
//! with [`RuntimeError::DeviceTimeout`]; the training loop then asks the host communicator
//! which rank is missing ([`name_missing_rank`]), as a host collective's timeout names it, and
//! the NCCL communicators are aborted so that their kernels stop (PyTorch's NCCL watchdog
//! does the same, at a default of 10 minutes).

use std::time::{Duration, Instant};

use crate::{Communicator, RuntimeError};

/// How long a device wait may take before it is a timeout, unless the run says otherwise:
/// PyTorch's NCCL watchdog default. A wait covers all the work queued before it (a step's
/// worth and more), so it is far longer than a host message's `--timeout`.
pub const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(600);

/// The first and the longest pause between two polls: short at first (a step's queued work
/// typically ends within milliseconds), then long enough that polling costs nothing.
const FIRST_PAUSE: Duration = Duration::from_micros(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(10);

/// Polls `done` until it says true, pausing a little longer each time, or fails with
/// [`RuntimeError::DeviceTimeout`] for `op` once `limit` has passed.
pub fn wait_until(
    op: &'static str,
    limit: Duration,
    mut done: impl FnMut() -> Result<bool, RuntimeError>,
) -> Result<(), RuntimeError> {
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        if done()? {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Err(RuntimeError::DeviceTimeout { op, after: waited });
        }
        std::thread::sleep(pause.min(limit - waited));
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// `e` as the user should read it: where it is a device timeout, the host communicator
/// `world` is asked which ranks are still here (a barrier under its own timeout). A rank that
/// does not come is named (the barrier's [`RuntimeError::Timeout`], beside the device
/// timeout); if every rank comes, they all wait on the device, and `e` is returned as it is.
pub fn name_missing_rank(e: RuntimeError, world: &dyn Communicator) -> RuntimeError {
    if !is_device_timeout(&e) {
        return e;
    }
    match world.barrier() {
        Ok(()) => e,
        // A timeout naming the missing ranks, or (ranks as threads of one process) the
        // failure another rank's timeout left on the shared communicator.
        Err(host) => RuntimeError::DeviceWaitMissing {
            device: Box::new(e),
            host: Box::new(host),
        },
    }
}

/// Whether `e`, or the error an instruction failed with, is a device timeout.
pub fn is_device_timeout(e: &RuntimeError) -> bool {
    let mut root = e;
    while let RuntimeError::Instr { source, .. } = root {
        root = source;
    }
    matches!(root, RuntimeError::DeviceTimeout { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::ThreadComm;

    #[test]
    fn a_wait_ends_when_the_work_does_or_at_the_deadline() {
        let mut polls = 0;
        wait_until("synchronize", Duration::from_secs(5), || {
            polls += 1;
            Ok(polls == 4)
        })
        .expect("done on the fourth poll");
        assert_eq!(polls, 4);
        let start = Instant::now();
        let e = wait_until("synchronize", Duration::from_millis(30), || Ok(false))
            .expect_err("never done");
        assert!(
            matches!(e, RuntimeError::DeviceTimeout { op: "synchronize", after } if after >= Duration::from_millis(30)),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(2), "gave up in time");
    }

    #[test]
    fn a_device_timeout_names_the_rank_that_does_not_reach_the_barrier() {
        let timeout = || RuntimeError::DeviceTimeout {
            op: "download",
            after: Duration::from_secs(600),
        };
        // Rank 2 has died: ranks 0 and 1 time out on the device and ask who is here.
        let got = ThreadComm::run(3, Duration::from_millis(200), |c| {
            (c.rank() != 2).then(|| name_missing_rank(timeout(), &c))
        })
        .expect("ran");
        let named: Vec<RuntimeError> = got.into_iter().flatten().collect();
        assert_eq!(named.len(), 2);
        for e in &named {
            assert!(matches!(e, RuntimeError::DeviceWaitMissing { .. }), "{e}");
            assert!(e.to_string().contains("download"), "{e}");
        }
        // The first to give up names rank 2 (the other finds the communicator failed by it).
        let timed_out = named.iter().any(|e| {
            matches!(e, RuntimeError::DeviceWaitMissing { host, .. }
                if matches!(**host, RuntimeError::Timeout { ref missing, .. } if missing == &[2]))
        });
        assert!(timed_out, "{named:?}");
        // Every rank came: the device timeout stands as it is.
        let got = ThreadComm::run(2, Duration::from_secs(5), |c| {
            name_missing_rank(timeout(), &c)
        })
        .expect("ran");
        for e in got {
            assert!(matches!(e, RuntimeError::DeviceTimeout { .. }), "{e}");
        }
        // Any other error is left alone (no barrier).
        let other = RuntimeError::Cuda {
            op: "alloc",
            message: "out of memory".into(),
        };
        let c = ThreadComm::world(2).remove(0);
        assert!(matches!(
            name_missing_rank(other, &c),
            RuntimeError::Cuda { .. }
        ));
    }
}
