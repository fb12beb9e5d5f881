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

/// Layers per chunk for layers of unequal seconds (`layer_s[l]`: a block whose structure
/// changes), consecutive layers per chunk, at least one each: the split whose slowest chunk
/// (its layers plus `extra[c]`) is fastest. Bisects the bottleneck; a bottleneck is feasible
/// when filling each chunk greedily, as full as it stays within it while leaving a layer for
/// every later chunk, places every layer (filling earlier never hurts: what is left is a
/// shorter suffix).
pub fn bottleneck_split(layer_s: &[f64], chunks: usize, extra: &[f64]) -> Option<Vec<u32>> {
    let layers = layer_s.len();
    if chunks == 0 || layers < chunks || extra.len() != chunks {
        return None;
    }
    let total: f64 = layer_s.iter().sum::<f64>() + extra.iter().sum::<f64>();
    let (mut lo, mut hi) = (0.0f64, total);
    let mut best = greedy_fill(layer_s, extra, hi)?;
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        match greedy_fill(layer_s, extra, mid) {
            Some(split) => {
                best = split;
                hi = mid;
            }
            None => lo = mid,
        }
        if hi - lo <= 1e-12 * hi.max(1e-300) {
            break;
        }
    }
    Some(best)
}

/// Chunk sizes filling each chunk as far as `bound` allows (leaving a layer per later chunk),
/// or `None` when the layers do not fit `extra.len()` chunks within `bound`.
fn greedy_fill(layer_s: &[f64], extra: &[f64], bound: f64) -> Option<Vec<u32>> {
    let (layers, chunks) = (layer_s.len(), extra.len());
    let mut split = Vec::with_capacity(chunks);
    let mut next = 0;
    for (c, &e) in extra.iter().enumerate() {
        let keep_for_later = chunks - c - 1;
        let mut t = e;
        let mut n = 0;
        while next + n < layers - keep_for_later && t + layer_s[next + n] <= bound {
            t += layer_s[next + n];
            n += 1;
        }
        if n == 0 {
            return None;
        }
        split.push(n as u32);
        next += n;
    }
    (next == layers).then_some(split)
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

    /// The slowest chunk of `split` over layers of seconds `layer_s`.
    fn bottleneck(layer_s: &[f64], split: &[u32], extra: &[f64]) -> f64 {
        let mut start = 0;
        split
            .iter()
            .zip(extra)
            .map(|(&n, e)| {
                let t: f64 = layer_s[start..start + n as usize].iter().sum::<f64>() + e;
                start += n as usize;
                t
            })
            .fold(0.0, f64::max)
    }

    /// Brute force over every composition, for unequal layers.
    fn brute_unequal(layer_s: &[f64], chunks: usize, extra: &[f64]) -> f64 {
        fn rec(layer_s: &[f64], extra: &[f64], at: usize, c: usize, worst: f64, best: &mut f64) {
            let chunks = extra.len();
            if c + 1 == chunks {
                let t: f64 = layer_s[at..].iter().sum::<f64>() + extra[c];
                *best = best.min(worst.max(t));
                return;
            }
            for n in 1..=(layer_s.len() - at).saturating_sub(chunks - c - 1) {
                let t: f64 = layer_s[at..at + n].iter().sum::<f64>() + extra[c];
                rec(layer_s, extra, at + n, c + 1, worst.max(t), best);
            }
        }
        let mut best = f64::INFINITY;
        rec(layer_s, &extra[..chunks], 0, 0, 0.0, &mut best);
        best
    }

    #[test]
    fn bottleneck_split_matches_brute_force_on_unequal_layers() {
        // Three dense layers then cheaper expert layers (DeepSeek-V3's shape), and others.
        let cases: [(Vec<f64>, Vec<f64>); 4] = [
            (
                [vec![2.0; 3], vec![1.3; 9]].concat(),
                vec![0.5, 0.0, 0.0, 2.5],
            ),
            (vec![1.0, 5.0, 1.0, 1.0, 3.0, 0.2, 0.7], vec![0.0, 0.0, 0.0]),
            (vec![0.3; 10], vec![4.0, 0.0]),
            (vec![1.0, 2.0, 3.0, 4.0], vec![0.0; 4]),
        ];
        for (layer_s, extra) in cases {
            let split = bottleneck_split(&layer_s, extra.len(), &extra).unwrap();
            assert_eq!(split.len(), extra.len());
            assert!(split.iter().all(|&n| n >= 1), "{split:?}");
            assert_eq!(split.iter().sum::<u32>() as usize, layer_s.len());
            let got = bottleneck(&layer_s, &split, &extra);
            let want = brute_unequal(&layer_s, extra.len(), &extra);
            assert!(
                (got - want).abs() <= 1e-9 * want,
                "{split:?}: {got} vs {want}"
            );
        }
        assert_eq!(bottleneck_split(&[1.0; 2], 3, &[0.0; 3]), None);
    }

    #[test]
    fn end_stages_with_the_head_take_fewer_layers() {
        let split = balanced_split(32, 4, 1.0, &[0.5, 0.0, 0.0, 3.0]).unwrap();
        assert!(split[3] < split[1], "{split:?}");
    }
}
