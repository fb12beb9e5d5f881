//! Pipeline stage split: how many of the model's identical layers each chunk gets.
//!
//! With identical layers the bottleneck split (minimize the slowest chunk, Alpa's inter-operator
//! dynamic program specialised to equal layer costs) is found exactly by water-filling: start
//! every chunk at one layer and give each next layer to the chunk that would stay fastest. The
//! end chunks carry the embedding and the head, so they end up with fewer layers.

/// Layers per chunk for `layers` layers over `chunks` chunks, with `extra[c]` seconds of
/// non-layer work on chunk c and `layer_s` seconds per layer.
pub fn balanced_split(layers: u32, chunks: usize, layer_s: f64, extra: &[f64]) -> Option<Vec<u32>> {
    if chunks == 0 || (layers as usize) < chunks || extra.len() != chunks {
        return None;
    }
    let mut n = vec![1u32; chunks];
    for _ in chunks as u32..layers {
        // Ties go to the lowest index, so splits are deterministic.
        let mut best = 0;
        let mut best_t = f64::INFINITY;
        for c in 0..chunks {
            let t = f64::from(n[c] + 1) * layer_s + extra[c];
            if t < best_t - 1e-15 {
                best_t = t;
                best = c;
            }
        }
        n[best] += 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force over every composition of `layers` into `chunks` positive parts.
    fn brute(layers: u32, chunks: usize, layer_s: f64, extra: &[f64]) -> f64 {
        fn rec(
            left: u32,
            c: usize,
            chunks: usize,
            layer_s: f64,
            extra: &[f64],
            worst: f64,
            best: &mut f64,
        ) {
            if c + 1 == chunks {
                let t = worst.max(f64::from(left) * layer_s + extra[c]);
                *best = best.min(t);
                return;
            }
            for k in 1..=left.saturating_sub((chunks - c - 1) as u32) {
                let t = worst.max(f64::from(k) * layer_s + extra[c]);
                rec(left - k, c + 1, chunks, layer_s, extra, t, best);
            }
        }
        let mut best = f64::INFINITY;
        rec(layers, 0, chunks, layer_s, extra, 0.0, &mut best);
        best
    }

    #[test]
    fn water_filling_matches_brute_force() {
        for (layers, extra) in [
            (12u32, vec![0.5, 0.0, 0.0, 2.5]),
            (10, vec![0.0, 0.0, 0.0]),
            (9, vec![3.0, 0.2, 1.0]),
            (7, vec![0.0, 5.0]),
        ] {
            let split = balanced_split(layers, extra.len(), 1.0, &extra).unwrap();
            assert_eq!(split.iter().sum::<u32>(), layers);
            let got = split
                .iter()
                .zip(&extra)
                .map(|(&n, e)| f64::from(n) + e)
                .fold(0.0, f64::max);
            assert!(
                (got - brute(layers, extra.len(), 1.0, &extra)).abs() < 1e-12,
                "{split:?}"
            );
        }
    }

    #[test]
    fn end_stages_with_the_head_take_fewer_layers() {
        let split = balanced_split(32, 4, 1.0, &[0.5, 0.0, 0.0, 3.0]).unwrap();
        assert!(split[3] < split[1], "{split:?}");
    }
}
