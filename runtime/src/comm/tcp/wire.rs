//! The bytes on a TCP link: a message is its group's id, its tag and its length, then that
//! many f32s, all little-endian.

use std::io::{self, Read};

/// The header's size: group id (u64), tag (u32), element count (u64).
const HEADER: usize = 20;

/// One message, framed.
pub(super) fn encode(group: u64, tag: u32, data: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 4 * data.len());
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Reads the next message: (group, tag, data). The caller sets the read deadline.
pub(super) fn read_message(stream: &mut impl Read) -> io::Result<(u64, u32, Vec<f32>)> {
    let mut head = [0u8; HEADER];
    stream.read_exact(&mut head)?;
    let group = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let tag = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
    let len = u64::from_le_bytes(head[12..].try_into().unwrap_or_default());
    let len = usize::try_from(len)
        .ok()
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "message length"))?;
    let mut bytes = vec![0u8; 4 * len];
    stream.read_exact(&mut bytes)?;
    let data = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((group, tag, data))
}

#[cfg(test)]
mod tests {
    use super::{encode, read_message};

    #[test]
    fn a_message_reads_back_as_written() {
        let data = [1.5f32, -0.0, f32::INFINITY, 3.25e-20];
        let bytes = encode(0xfeed_beef_0123, 7, &data);
        let (group, tag, got) = read_message(&mut bytes.as_slice()).unwrap_or_default();
        assert_eq!((group, tag), (0xfeed_beef_0123, 7));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&data));
    }
}
