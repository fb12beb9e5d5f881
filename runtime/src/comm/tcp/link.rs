//! One rank's connection to another: sends are queued to a writer thread (so that two ranks
//! sending each other large buffers at once never both block on full socket buffers, and a
//! send returns at once, as the communicator contract's buffered sends do); receives read the
//! socket on the caller's thread until the message wanted arrives, keeping the others by
//! (group, tag) in arrival order.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use super::wire::{encode, read_message};

/// Messages received but not yet asked for, by (group, tag), oldest first.
type Pending = HashMap<(u64, u32), VecDeque<Vec<f32>>>;

/// Why a receive failed.
#[derive(Debug)]
pub(super) enum RecvError {
    /// Nothing arrived before the deadline.
    TimedOut,
    /// The connection broke (the peer exited, or sent what is not a message).
    Closed(String),
}

pub(super) enum Link {
    /// To another process.
    Remote {
        writer: Option<(mpsc::Sender<Vec<u8>>, JoinHandle<()>)>,
        inbox: Mutex<(TcpStream, Pending)>,
    },
    /// To this rank itself (a ring of one sends to itself).
    Local(Mutex<Pending>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Link::Remote { .. } => "Link::Remote",
            Link::Local(_) => "Link::Local",
        })
    }
}

impl Link {
    pub(super) fn remote(stream: TcpStream) -> io::Result<Link> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(false)?;
        let mut out = stream.try_clone()?;
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let thread = std::thread::Builder::new()
            .name("plait-tcp-send".into())
            .spawn(move || {
                for bytes in rx {
                    if out.write_all(&bytes).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Link::Remote {
            writer: Some((tx, thread)),
            inbox: Mutex::new((stream, Pending::new())),
        })
    }

    pub(super) fn local() -> Link {
        Link::Local(Mutex::new(Pending::new()))
    }

    /// Queues `data` for the peer.
    pub(super) fn send(&self, group: u64, tag: u32, data: &[f32]) -> Result<(), String> {
        match self {
            Link::Remote { writer, .. } => writer
                .as_ref()
                .ok_or_else(|| "the link is closed".to_string())?
                .0
                .send(encode(group, tag, data))
                .map_err(|_| "the connection closed (the peer exited?)".to_string()),
            Link::Local(p) => {
                let mut p = p.lock().map_err(|_| "a rank panicked".to_string())?;
                p.entry((group, tag)).or_default().push_back(data.to_vec());
                Ok(())
            }
        }
    }

    /// The oldest message of (group, tag) from the peer, waiting until `deadline`.
    pub(super) fn recv(
        &self,
        group: u64,
        tag: u32,
        deadline: Instant,
    ) -> Result<Vec<f32>, RecvError> {
        let key = (group, tag);
        match self {
            Link::Local(p) => p
                .lock()
                .map_err(|_| RecvError::Closed("a rank panicked".into()))?
                .get_mut(&key)
                .and_then(VecDeque::pop_front)
                .ok_or(RecvError::TimedOut),
            Link::Remote { inbox, .. } => {
                let mut inbox = inbox
                    .lock()
                    .map_err(|_| RecvError::Closed("a rank panicked".into()))?;
                let (stream, pending) = &mut *inbox;
                loop {
                    if let Some(m) = pending.get_mut(&key).and_then(VecDeque::pop_front) {
                        return Ok(m);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvError::TimedOut);
                    }
                    stream
                        .set_read_timeout(Some(left))
                        .map_err(|e| RecvError::Closed(e.to_string()))?;
                    match read_message(stream) {
                        Ok((g, t, data)) => pending.entry((g, t)).or_default().push_back(data),
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) =>
                        {
                            return Err(RecvError::TimedOut);
                        }
                        Err(e) => return Err(RecvError::Closed(e.to_string())),
                    }
                }
            }
        }
    }
}

impl Drop for Link {
    /// Flushes what is queued before the connection closes (a rank's last message must not
    /// die with its process).
    fn drop(&mut self) {
        if let Link::Remote { writer, .. } = self
            && let Some((tx, thread)) = writer.take()
        {
            drop(tx);
            let _ = thread.join();
        }
    }
}
