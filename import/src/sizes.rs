//! The sizes plait plans for: a model whose tensors or parameters go beyond them is refused
//! when it is loaded, naming the tensor, rather than planned with element, byte and FLOP
//! counts that wrapped around 2^64 (a `hidden_size` of 2^40 squared) or that no machine holds.

use ir::{Graph, OpKind};

/// The most elements one tensor may hold in its fixed dimensions, and the most parameters a
/// model may have: 2^50 (about 10^15), a thousand times the largest models trained (a few
/// trillion parameters). Bytes (× 4) and FLOPs (× 6 per parameter and token) of such a model
/// still fit in 64 bits.
pub const MAX_ELEMENTS: u128 = 1 << 50;

/// What goes beyond [`MAX_ELEMENTS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oversize {
    /// A parameter's name, or the op that makes the tensor; `None`: the model's parameters
    /// together.
    pub tensor: Option<String>,
    /// Its fixed dimensions (empty for the parameter total).
    pub dims: Vec<u64>,
    /// Elements (saturating at `u128::MAX`).
    pub elements: u128,
}

/// The first tensor, in program order, whose fixed dimensions hold more than
/// [`MAX_ELEMENTS`] elements, else the parameters' total where it is over.
pub fn oversize(graph: &Graph) -> Option<Oversize> {
    let mut params: u128 = 0;
    for &o in graph.order() {
        let op = graph.op(o);
        for &r in &op.results {
            let dims: Vec<u64> = graph
                .ty(r)
                .shape
                .0
                .iter()
                .filter_map(|d| d.fixed())
                .collect();
            let elements = dims
                .iter()
                .fold(1u128, |n, &d| n.saturating_mul(u128::from(d)));
            if elements > MAX_ELEMENTS {
                let tensor = match &op.kind {
                    OpKind::Param { name } => format!("parameter `{name}`"),
                    kind => format!("the result of `{}`", kind.mnemonic()),
                };
                return Some(Oversize {
                    tensor: Some(tensor),
                    dims,
                    elements,
                });
            }
            if matches!(op.kind, OpKind::Param { .. }) {
                params = params.saturating_add(elements);
            }
        }
    }
    (params > MAX_ELEMENTS).then_some(Oversize {
        tensor: None,
        dims: Vec::new(),
        elements: params,
    })
}

impl std::fmt::Display for Oversize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tensor {
            Some(t) => {
                let dims: Vec<String> = self.dims.iter().map(u64::to_string).collect();
                write!(
                    f,
                    "{t} would hold {} = {} elements",
                    dims.join(" x "),
                    self.elements
                )
            }
            None => write!(f, "its parameters would number {}", self.elements),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_forward;
    use crate::spec::ModelSpec;
    use ir::DType;

    /// Llama-2 7B's shape at `hidden` (4 heads, an MLP 4·hidden wide), 2 layers, vocab 100.
    fn llama(hidden: u64) -> Graph {
        let spec = ModelSpec {
            hidden,
            heads: 4,
            kv_heads: 4,
            ffn: 4 * hidden,
            layers: 2,
            vocab: 100,
            ..crate::zoo::find("llama2-7b").unwrap()
        };
        build_forward(&spec, DType::F32).unwrap()
    }

    #[test]
    fn a_square_weight_over_the_limit_is_named() {
        // 2^26 squared is 2^52 elements: over 2^50. At 2^20 the model's 32·h² parameters
        // (2^45) are under.
        let o = oversize(&llama(1 << 26)).expect("refused");
        assert!(o.tensor.unwrap().starts_with("parameter"));
        assert_eq!(o.elements, 1 << 52);
        assert_eq!(oversize(&llama(1 << 20)), None);
    }

    #[test]
    fn the_parameter_total_is_checked_too() {
        // Each weight under 2^50, together over it: 2 layers of 4·h² attention and 3·h·(4h)
        // MLP weights at h = 2^23 (32·h² = 2^51; the widest matrix 4·h² = 2^48).
        let o = oversize(&llama(1 << 23)).map(|o| o.tensor);
        assert_eq!(o, Some(None));
    }
}
