//! Which earlier keys a causal query sees besides the causal limit: the `window` most recent
//! (a sliding window: Mistral, Gemma 2/3, gpt-oss) and only those of its own `chunk` of
//! positions (Llama 4's chunked attention: `attention_chunk_size`, keys j with
//! ⌊j / chunk⌋ = ⌊i / chunk⌋). A query at position p that the causal mask lets see keys
//! 0..=p sees keys first..=p, `first` the larger of the two limits.

use serde::{Deserialize, Serialize};

/// An attention's mask beyond causality; [`KeyMask::CAUSAL`] where it has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyMask {
    pub window: Option<u64>,
    pub chunk: Option<u64>,
}

impl KeyMask {
    /// Every earlier key.
    pub const CAUSAL: KeyMask = KeyMask {
        window: None,
        chunk: None,
    };

    pub fn is_causal(&self) -> bool {
        *self == KeyMask::CAUSAL
    }

    /// The first key a query that the causal mask lets see keys `0..visible` reads (0 where
    /// it sees none).
    pub fn first_key(&self, visible: u64) -> u64 {
        let Some(last) = visible.checked_sub(1) else {
            return 0;
        };
        let windowed = self.window.map_or(0, |w| visible.saturating_sub(w));
        let chunked = self.chunk.filter(|&c| c > 0).map_or(0, |c| last - last % c);
        windowed.max(chunked)
    }

    /// How many keys the query at position `p` sees (keys 0..=p causally).
    pub fn keys_of(&self, p: u64) -> u64 {
        p + 1 - self.first_key(p + 1)
    }

    /// The most keys any query sees: the window or the chunk, the narrower; none for causal.
    pub fn widest(&self) -> Option<u64> {
        match (self.window, self.chunk) {
            (Some(w), Some(c)) => Some(w.min(c)),
            (w, c) => w.or(c),
        }
    }

    /// Σ of [`KeyMask::keys_of`] over positions 0..m, in closed form: per whole chunk the sum
    /// over its c positions, then the partial chunk's.
    pub fn keys_seen(&self, m: u64) -> f64 {
        let in_window = |n: u64| -> f64 {
            // Σ_{q<n} min(q + 1, w).
            let n = n as f64;
            match self.window.map(|w| w as f64) {
                Some(w) if n > w => w * (w + 1.0) / 2.0 + (n - w) * w,
                _ => n * (n + 1.0) / 2.0,
            }
        };
        match self.chunk.filter(|&c| c > 0) {
            Some(c) => (m / c) as f64 * in_window(c) + in_window(m % c),
            None => in_window(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The closed forms against counting each query's keys one by one.
    #[test]
    fn closed_forms_count_the_keys() {
        let masks = [
            KeyMask::CAUSAL,
            KeyMask {
                window: Some(3),
                chunk: None,
            },
            KeyMask {
                window: None,
                chunk: Some(4),
            },
            KeyMask {
                window: Some(3),
                chunk: Some(5),
            },
        ];
        for mask in masks {
            for m in 0..23u64 {
                let counted: u64 = (0..m)
                    .map(|p| (0..=p).filter(|&j| sees(&mask, p, j)).count() as u64)
                    .sum();
                assert_eq!(mask.keys_seen(m), counted as f64, "{mask:?} over {m}");
            }
            for p in 0..23u64 {
                let first = (0..=p).find(|&j| sees(&mask, p, j)).unwrap();
                assert_eq!(mask.first_key(p + 1), first, "{mask:?} at {p}");
            }
        }
    }

    /// The definition: within the window's reach and in the query's own chunk.
    fn sees(mask: &KeyMask, p: u64, j: u64) -> bool {
        let in_window = mask.window.is_none_or(|w| p - j < w);
        let in_chunk = mask.chunk.is_none_or(|c| j / c == p / c);
        j <= p && in_window && in_chunk
    }

    #[test]
    fn a_chunked_query_sees_its_chunk_only() {
        let chunked = KeyMask {
            window: None,
            chunk: Some(8192),
        };
        assert_eq!(chunked.first_key(8192), 0);
        assert_eq!(chunked.first_key(8193), 8192);
        assert_eq!(chunked.widest(), Some(8192));
    }
}
