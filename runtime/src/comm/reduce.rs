//! The one summation every communicator uses, so that all of them agree bit for bit.

/// `out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + …` in f32: rank order, starting
/// from rank 0's value. Every part has `out.len()` elements (checked by the callers).
pub(crate) fn sum_in_rank_order<P: AsRef<[f32]>>(parts: &[P], out: &mut [f32]) {
    let mut parts = parts.iter();
    if let Some(first) = parts.next() {
        out.copy_from_slice(first.as_ref());
    }
    for p in parts {
        for (o, &x) in out.iter_mut().zip(p.as_ref()) {
            *o += x;
        }
    }
}
