//! Rank 0's opaque bytes (NCCL's 128-byte unique id) to every rank of a launched run, over
//! TCP at the launcher's `MASTER_ADDR`, on the port after `MASTER_PORT` (torchrun's own store
//! holds `MASTER_PORT`; `PLAIT_RENDEZVOUS_PORT` sets another), as torchrun's store carries
//! NCCL's id: rank 0 listens, every other rank connects (retrying until rank 0 is up) and
//! says who it is, and once all have arrived rank 0 sends each the bytes. A rank that never
//! arrives makes rank 0 fail at the deadline naming it ([`RuntimeError::Timeout`]); a rank
//! that cannot reach rank 0 fails naming rank 0; a connection that is not a plait rank (a
//! port probe) is dropped. Nothing else travels here: the collectives run on the
//! communicator the id opens.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::RuntimeError;
use crate::launch::Launch;

/// What a rank sends first: this protocol's name and version.
const HELLO: &[u8; 8] = b"plaitrv1";

/// The longest id accepted (NCCL's is 128 bytes).
const MAX_ID: usize = 4096;

/// Every rank's copy of rank 0's `id` (`Some` on rank 0, ignored elsewhere), exchanged at the
/// launch's master address.
pub fn share_id(
    launch: &Launch,
    id: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<u8>, RuntimeError> {
    let Some(master) = &launch.master else {
        return Err(RuntimeError::Launch {
            var: "MASTER_ADDR",
            value: String::new(),
            reason: format!(
                "is not set: {} started {} ranks without a master address for the NCCL id \
                 (set MASTER_ADDR and MASTER_PORT, or launch with torchrun)",
                launch.launcher.name(),
                launch.world_size
            ),
        });
    };
    let port = master
        .rendezvous_port()
        .ok_or_else(|| RuntimeError::Launch {
            var: "MASTER_PORT",
            value: master.port.to_string(),
            reason: "leaves no port after it for plait's rendezvous: set PLAIT_RENDEZVOUS_PORT"
                .into(),
        })?;
    let addr = format!("{}:{port}", master.addr);
    if launch.rank == 0 {
        let id = id.ok_or_else(|| RuntimeError::Launch {
            var: "RANK",
            value: "0".into(),
            reason: "is the rendezvous root but has no id to share".into(),
        })?;
        // Both address families where the system allows (IPv6's unspecified address also
        // takes IPv4 on Linux), else IPv4 only.
        let listener = TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, port))
            .or_else(|_| TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)))
            .map_err(io_error(
                &addr,
                format!(
                    "rank 0 cannot listen on port {port} (set PLAIT_RENDEZVOUS_PORT to a free one)"
                ),
            ))?;
        serve_id(&listener, launch.world_size, id, timeout)?;
        Ok(id.to_vec())
    } else {
        fetch_id(&addr, launch.rank, launch.world_size, timeout)
    }
}

/// Rank 0's side: waits on `listener` for ranks `1..world_size`, then sends each `id`.
pub fn serve_id(
    listener: &TcpListener,
    world_size: usize,
    id: &[u8],
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let start = Instant::now();
    let mut peers: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    listener
        .set_nonblocking(true)
        .map_err(io_error(&addr, "set the listener non-blocking".into()))?;
    while peers.iter().skip(1).any(Option::is_none) {
        match listener.accept() {
            Ok((stream, _)) => {
                let left = timeout.saturating_sub(start.elapsed());
                let Some((rank, stream)) = greet(stream, world_size, left)? else {
                    continue;
                };
                if peers[rank].is_some() {
                    return Err(mismatch(format!("two processes say they are rank {rank}")));
                }
                peers[rank] = Some(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() >= timeout {
                    let missing = (1..world_size).filter(|&r| peers[r].is_none()).collect();
                    return Err(timed_out(0, world_size, missing, start.elapsed()));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(io_error(&addr, "accept a rank".into())(e)),
        }
    }
    let len = u32::try_from(id.len()).unwrap_or(u32::MAX);
    for (rank, stream) in peers.iter_mut().enumerate().skip(1) {
        if let Some(s) = stream {
            s.write_all(&len.to_le_bytes())
                .and_then(|()| s.write_all(id))
                .map_err(io_error(&addr, format!("send the id to rank {rank}")))?;
        }
    }
    Ok(())
}

/// Reads a rank's greeting: the protocol name, its rank and the world size it was told.
/// `None`: not a plait rank (it closed, said something else, or said nothing within a
/// moment: a rank greets as soon as it connects), dropped.
fn greet(
    mut stream: TcpStream,
    world_size: usize,
    left: Duration,
) -> Result<Option<(usize, TcpStream)>, RuntimeError> {
    let moment = left.clamp(Duration::from_millis(1), Duration::from_secs(2));
    let mut hello = [0u8; 16];
    let read = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(moment)))
        .and_then(|()| stream.read_exact(&mut hello));
    if read.is_err() || &hello[..8] != HELLO {
        return Ok(None);
    }
    let word = |i: usize| {
        u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]) as usize
    };
    let (rank, theirs) = (word(8), word(12));
    if theirs != world_size {
        return Err(mismatch(format!(
            "rank {rank} was launched with world size {theirs}, rank 0 with {world_size}"
        )));
    }
    if rank == 0 || rank >= world_size {
        return Err(mismatch(format!(
            "a process says it is rank {rank} of {world_size}"
        )));
    }
    Ok(Some((rank, stream)))
}

/// Rank `rank`'s side: connects to rank 0 at `addr` (retrying until the deadline) and reads
/// the id.
pub fn fetch_id(
    addr: &str,
    rank: usize,
    world_size: usize,
    timeout: Duration,
) -> Result<Vec<u8>, RuntimeError> {
    let start = Instant::now();
    let mut stream = loop {
        match connect(addr) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => return Err(timed_out(rank, world_size, vec![0], start.elapsed())),
        }
    };
    let mut hello = HELLO.to_vec();
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world_size as u32).to_le_bytes());
    stream
        .write_all(&hello)
        .map_err(io_error(addr, "send this rank's greeting".into()))?;
    // Rank 0 answers once every rank has arrived: wait what is left of the deadline.
    let left = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(left))
        .map_err(io_error(addr, "set a read deadline".into()))?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(io_error(
        addr,
        format!("rank {rank} waited for the id from rank 0 (which waits for every rank)"),
    ))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_ID {
        return Err(mismatch(format!("rank 0 sent an id of {len} bytes")));
    }
    let mut id = vec![0u8; len];
    stream
        .read_exact(&mut id)
        .map_err(io_error(addr, "read the id".into()))?;
    Ok(id)
}

fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, Duration::from_secs(1)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn timed_out(rank: usize, world_size: usize, missing: Vec<usize>, after: Duration) -> RuntimeError {
    world_timeout("rendezvous", rank, world_size, missing, after)
}

/// `op`, waited on by world rank `rank` of `world_size`, timed out on the ranks `missing`.
pub(crate) fn world_timeout(
    op: &'static str,
    rank: usize,
    world_size: usize,
    missing: Vec<usize>,
    after: Duration,
) -> RuntimeError {
    RuntimeError::Timeout {
        op,
        rank,
        group: (0..world_size).collect(),
        missing,
        after,
    }
}

fn mismatch(detail: String) -> RuntimeError {
    RuntimeError::Mismatch {
        op: "rendezvous",
        rank: 0,
        detail,
    }
}

fn io_error(addr: &str, what: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let addr = addr.to_string();
    move |e| RuntimeError::Rendezvous {
        addr,
        what,
        kind: e.kind(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = l.local_addr().expect("bound").to_string();
        (l, addr)
    }

    #[test]
    fn every_rank_gets_rank_zeros_id() {
        let (l, addr) = listener();
        let id: Vec<u8> = (0..128u8).collect();
        let peers: Vec<_> = (1..4)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || fetch_id(&addr, r, 4, Duration::from_secs(10)))
            })
            .collect();
        serve_id(&l, 4, &id, Duration::from_secs(10)).expect("served");
        for p in peers {
            assert_eq!(p.join().expect("joined").expect("fetched"), id);
        }
    }

    #[test]
    fn a_stray_connection_is_dropped_and_the_ranks_still_meet() {
        let (l, addr) = listener();
        let mut probe = TcpStream::connect(&addr).expect("a probe connects");
        probe
            .write_all(b"GET / HTTP/1.0\r\n\r\n")
            .expect("the probe writes");
        let silent = TcpStream::connect(&addr).expect("a silent one connects");
        let peer = std::thread::spawn(move || fetch_id(&addr, 1, 2, Duration::from_secs(10)));
        serve_id(&l, 2, b"nccl-id", Duration::from_secs(10)).expect("served");
        assert_eq!(peer.join().expect("joined").expect("fetched"), b"nccl-id");
        drop(silent);
    }

    #[test]
    fn a_rank_that_never_comes_is_named_by_rank_zero() {
        let (l, addr) = listener();
        let peer = std::thread::spawn(move || fetch_id(&addr, 1, 3, Duration::from_millis(600)));
        let e = serve_id(&l, 3, b"id", Duration::from_millis(300)).expect_err("rank 2 is missing");
        assert!(
            matches!(&e, RuntimeError::Timeout { missing, .. } if missing == &[2]),
            "{e}"
        );
        // Rank 1 arrived but rank 0 gave up: it fails too, saying what it waited for.
        let e = peer.join().expect("joined").expect_err("no id came");
        assert!(
            e.to_string().contains("waited for the id from rank 0"),
            "{e}"
        );
    }

    #[test]
    fn a_rank_without_rank_zero_names_it_and_mismatches_are_refused() {
        let (l, addr) = listener();
        drop(l);
        let e = fetch_id(&addr, 1, 2, Duration::from_millis(200)).expect_err("nobody listens");
        assert!(
            matches!(&e, RuntimeError::Timeout { missing, .. } if missing == &[0]),
            "{e}"
        );
        let (l, addr) = listener();
        let peer = std::thread::spawn(move || fetch_id(&addr, 1, 3, Duration::from_millis(500)));
        let e = serve_id(&l, 2, b"id", Duration::from_secs(5)).expect_err("sizes differ");
        assert!(e.to_string().contains("world size 3, rank 0 with 2"), "{e}");
        drop(l);
        assert!(peer.join().expect("joined").is_err());
    }
}
