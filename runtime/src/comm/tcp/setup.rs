//! How the ranks of a launch connect: each listens on a port of its own choosing and tells
//! rank 0, which listens at the launch's master address on the mesh port (`Master::mesh_port`)
//! and, once every rank has arrived, sends each the table of addresses; then every rank
//! connects to the ranks below it (rank 0's connection is the one it arrived on) and accepts
//! the ranks above it. A rank that never arrives is named at the deadline.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::TcpComm;
use super::link::Link;
use crate::RuntimeError;
use crate::launch::Launch;

/// What a rank sends first on every connection: this protocol's name and version.
const HELLO: &[u8; 8] = b"plaitmsh";

/// This process's rank of `launch`, connected to every other.
pub fn connect(launch: &Launch, timeout: Duration) -> Result<TcpComm, RuntimeError> {
    let Some(master) = &launch.master else {
        return Err(RuntimeError::Launch {
            var: "MASTER_ADDR",
            value: String::new(),
            reason: format!(
                "is not set: {} started {} ranks without a master address for them to meet at \
                 (set MASTER_ADDR and MASTER_PORT, as torchrun does)",
                launch.launcher.name(),
                launch.world_size
            ),
        });
    };
    let port = master.mesh_port().ok_or_else(|| RuntimeError::Launch {
        var: "MASTER_PORT",
        value: master.port.to_string(),
        reason: "leaves no port two after it for plait's ranks to meet: set PLAIT_RENDEZVOUS_PORT \
                 (the mesh takes the port after it)"
            .into(),
    })?;
    connect_at(&master.addr, port, launch.rank, launch.world_size, timeout)
}

/// Rank `rank` of `world` ranks meeting at `addr:port` (rank 0 listens there).
pub fn connect_at(
    addr: &str,
    port: u16,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<TcpComm, RuntimeError> {
    let start = Instant::now();
    let mut links: Vec<Option<Link>> = (0..world).map(|_| None).collect();
    links[rank] = Some(Link::local());
    let io = |what: String| {
        let addr = format!("{addr}:{port}");
        move |e: std::io::Error| RuntimeError::Rendezvous {
            addr,
            what,
            kind: e.kind(),
            message: e.to_string(),
        }
    };
    if world > 1 {
        if rank == 0 {
            let listener =
                TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).map_err(io(format!(
                    "rank 0 cannot listen on port {port} (set PLAIT_RENDEZVOUS_PORT to a free one)"
                )))?;
            let streams = hub(&listener, world, start, timeout)?;
            for (r, s) in streams {
                links[r] =
                    Some(Link::remote(s).map_err(io(format!("keep rank {r}'s connection")))?);
            }
        } else {
            let mine = TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
                .map_err(io("listen for the other ranks".into()))?;
            let my_port = mine
                .local_addr()
                .map_err(io("read this rank's port".into()))?
                .port();
            let (to_root, table) = join(addr, port, rank, world, my_port, start, timeout)?;
            links[0] = Some(Link::remote(to_root).map_err(io("keep rank 0's connection".into()))?);
            for (r, peer) in table.iter().enumerate().take(rank).skip(1) {
                let mut s = dial(peer, start, timeout, rank, world, r)?;
                s.write_all(&hello(rank, world))
                    .map_err(io(format!("greet rank {r}")))?;
                links[r] =
                    Some(Link::remote(s).map_err(io(format!("keep rank {r}'s connection")))?);
            }
            for (r, s) in accept_above(&mine, rank, world, start, timeout)? {
                links[r] =
                    Some(Link::remote(s).map_err(io(format!("keep rank {r}'s connection")))?);
            }
        }
    }
    let links = links
        .into_iter()
        .map(|l| l.unwrap_or_else(Link::local))
        .collect();
    Ok(TcpComm::world(rank, links))
}

fn hello(rank: usize, world: usize) -> Vec<u8> {
    let mut h = HELLO.to_vec();
    h.extend_from_slice(&(rank as u32).to_le_bytes());
    h.extend_from_slice(&(world as u32).to_le_bytes());
    h
}

/// Reads a greeting: (rank, the world size it was told); `None` for a connection that is not
/// a plait rank.
fn greeting(stream: &mut TcpStream, left: Duration) -> Option<(usize, usize)> {
    let mut h = [0u8; 16];
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(
            left.clamp(Duration::from_millis(1), Duration::from_secs(2)),
        ))
        .ok()?;
    stream.read_exact(&mut h).ok()?;
    if &h[..8] != HELLO {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as usize;
    Some((word(8), word(12)))
}

fn timed_out(rank: usize, world: usize, missing: Vec<usize>, after: Duration) -> RuntimeError {
    crate::comm::rendezvous::world_timeout("connect", rank, world, missing, after)
}

fn mismatch(rank: usize, detail: String) -> RuntimeError {
    RuntimeError::Mismatch {
        op: "connect",
        rank,
        detail,
    }
}

/// Accepts ranks on `listener` until `want` says every one has come (`None`: it was not a
/// plait rank, or it came twice), or the deadline passes naming those missing.
fn accept_ranks(
    listener: &TcpListener,
    me: usize,
    world: usize,
    expected: &[usize],
    start: Instant,
    timeout: Duration,
    mut on_rank: impl FnMut(usize, &mut TcpStream) -> Result<(), RuntimeError>,
) -> Result<Vec<(usize, TcpStream)>, RuntimeError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| mismatch(me, format!("the listener: {e}")))?;
    let mut got: Vec<(usize, TcpStream)> = Vec::new();
    while got.len() < expected.len() {
        match listener.accept() {
            Ok((mut s, _)) => {
                let left = timeout.saturating_sub(start.elapsed());
                let Some((r, theirs)) = greeting(&mut s, left) else {
                    continue;
                };
                if theirs != world {
                    return Err(mismatch(
                        me,
                        format!(
                            "rank {r} was launched with world size {theirs}, rank {me} with {world}"
                        ),
                    ));
                }
                if !expected.contains(&r) || got.iter().any(|(g, _)| *g == r) {
                    return Err(mismatch(
                        me,
                        format!("an unexpected connection says it is rank {r} of {world}"),
                    ));
                }
                on_rank(r, &mut s)?;
                got.push((r, s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() >= timeout {
                    let missing = expected
                        .iter()
                        .copied()
                        .filter(|r| got.iter().all(|(g, _)| g != r))
                        .collect();
                    return Err(timed_out(me, world, missing, start.elapsed()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(mismatch(me, format!("accept: {e}"))),
        }
    }
    Ok(got)
}

/// Rank 0: every other rank's connection, once each has told its port; then the address
/// table (the address each came from, its port) sent to every one.
fn hub(
    listener: &TcpListener,
    world: usize,
    start: Instant,
    timeout: Duration,
) -> Result<Vec<(usize, TcpStream)>, RuntimeError> {
    let expected: Vec<usize> = (1..world).collect();
    let mut ports = vec![0u16; world];
    let mut arrived = accept_ranks(listener, 0, world, &expected, start, timeout, |r, s| {
        let mut p = [0u8; 2];
        s.read_exact(&mut p)
            .map_err(|e| mismatch(0, format!("rank {r}'s port: {e}")))?;
        ports[r] = u16::from_le_bytes(p);
        Ok(())
    })?;
    let mut addrs = vec![String::new(); world];
    for (r, s) in &arrived {
        addrs[*r] = s
            .peer_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
    }
    let table: String = (0..world)
        .map(|r| format!("{} {}\n", addrs[r], ports[r]))
        .collect();
    let bytes = table.into_bytes();
    for (r, s) in &mut arrived {
        s.write_all(&(bytes.len() as u32).to_le_bytes())
            .and_then(|()| s.write_all(&bytes))
            .map_err(|e| mismatch(0, format!("send rank {r} the table: {e}")))?;
    }
    Ok(arrived)
}

/// A connection to `addr`, retried until the deadline (the peer may not listen yet); the
/// deadline names `peer` as missing.
fn dial(
    addr: &str,
    start: Instant,
    timeout: Duration,
    me: usize,
    world: usize,
    peer: usize,
) -> Result<TcpStream, RuntimeError> {
    loop {
        let attempt = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).ok());
        match attempt {
            Some(s) => return Ok(s),
            None if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            None => return Err(timed_out(me, world, vec![peer], start.elapsed())),
        }
    }
}

/// Rank `rank` (not 0): arrives at rank 0 with its port and reads the address table.
fn join(
    addr: &str,
    port: u16,
    rank: usize,
    world: usize,
    my_port: u16,
    start: Instant,
    timeout: Duration,
) -> Result<(TcpStream, Vec<String>), RuntimeError> {
    let mut s = dial(&format!("{addr}:{port}"), start, timeout, rank, world, 0)?;
    let mut first = hello(rank, world);
    first.extend_from_slice(&my_port.to_le_bytes());
    let broke = |e: std::io::Error| mismatch(rank, format!("rank 0 at {addr}:{port}: {e}"));
    s.write_all(&first).map_err(broke)?;
    // Rank 0 answers once every rank has arrived.
    let left = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(broke)?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .map_err(|_| timed_out(rank, world, vec![0], start.elapsed()))?;
    let mut table = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut table).map_err(broke)?;
    let table = String::from_utf8_lossy(&table);
    let peers: Vec<String> = table
        .lines()
        .map(|l| match l.split_once(' ') {
            Some((ip, p)) if ip.contains(':') => format!("[{ip}]:{p}"),
            Some((ip, p)) => format!("{ip}:{p}"),
            None => String::new(),
        })
        .collect();
    if peers.len() != world {
        return Err(mismatch(
            rank,
            format!("rank 0 sent {} addresses for {world} ranks", peers.len()),
        ));
    }
    Ok((s, peers))
}

/// Rank `rank`'s connections from the ranks above it, each greeting as it connects.
fn accept_above(
    listener: &TcpListener,
    rank: usize,
    world: usize,
    start: Instant,
    timeout: Duration,
) -> Result<Vec<(usize, TcpStream)>, RuntimeError> {
    let expected: Vec<usize> = (rank + 1..world).collect();
    accept_ranks(listener, rank, world, &expected, start, timeout, |_, _| {
        Ok(())
    })
}
