//! What attention's forward keeps for its backward, where the backend keeps it: each query
//! row's log-sum-exp (FlashAttention-2, Dao 2023: the backward then needs one pass of
//! D = dO·O over the forward's output instead of recomputing the forward for its row
//! statistics).
//!
//! The program declares the statistic as the forward's `saves` buffer (`[batch, heads, sq]`,
//! role `Saved`: memory the plan counts from the forward to the backward), and frees the
//! forward's output once the last linear that reads it is done, typically a few instructions
//! before attention's gradient. The executor pairs each such forward with its gradient
//! statically ([`plan`]: the same operands, nothing writing them or the output in between),
//! keeps the statistic under its `saves` buffer, and holds an output the program frees before
//! the gradient until the gradient has read it ([`Kept`]).

use std::collections::HashMap;

use ir::OpKind;
use program::{BufferId, Instr, Role, Template};

/// One forward whose statistic its gradient reads: the `saves` buffer that names the
/// statistic, and the forward's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    pub stats: BufferId,
    pub out: BufferId,
}

/// Per step instruction: the forward that keeps (`forward`) and the gradient that reads
/// (`grad`) each [`Keep`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptPlan {
    pub forward: Vec<Option<Keep>>,
    pub grad: Vec<Option<Keep>>,
}

/// A forward attention's operands and [`Keep`], where it declares a row statistic.
fn forward_keep(tpl: &Template, ins: &Instr) -> Option<(Vec<BufferId>, Keep)> {
    let Instr::Compute {
        kind: OpKind::Attention { .. },
        inputs,
        outputs,
        saves,
        ..
    } = ins
    else {
        return None;
    };
    let (&[out], &[stats]) = (outputs.as_slice(), saves.as_slice()) else {
        return None;
    };
    let declared = tpl.buffer(stats)?;
    // `[batch, heads, sq]`: a row statistic (a materialized attention saves its scores).
    let row_statistic = declared.role == Role::Saved && declared.shape.len() == 3;
    (inputs.len() == 3 && row_statistic).then(|| (inputs.clone(), Keep { stats, out }))
}

/// The operands of an attention gradient that asks for all of q, k and v.
fn grad_operands(ins: &Instr) -> Option<&[BufferId]> {
    let Instr::Compute {
        kind: OpKind::Grad { of, wrt },
        inputs,
        ..
    } = ins
    else {
        return None;
    };
    let all = matches!(**of, OpKind::Attention { .. }) && wrt.as_slice() == [0, 1, 2];
    (all && inputs.len() == 4).then(|| &inputs[..3])
}

/// Whether an instruction in `between` writes (or allocates anew) any of `bufs`.
fn touched(between: &[Instr], bufs: &[BufferId]) -> bool {
    between.iter().any(|ins| match ins {
        Instr::Alloc { buf } => bufs.contains(buf),
        _ => program::verify::operands(ins)
            .1
            .iter()
            .any(|b| bufs.contains(b)),
    })
}

/// Pairs each forward attention that declares a row statistic with the gradient on the same
/// operands, where neither the operands nor the output are written in between (the
/// statistic would then be stale, and the gradient recomputes it).
pub fn plan(tpl: &Template) -> KeptPlan {
    let n = tpl.instrs.len();
    let mut kept = KeptPlan {
        forward: vec![None; n],
        grad: vec![None; n],
    };
    // The latest forward on each operand list (a recomputed forward replaces the first).
    let mut open: HashMap<Vec<BufferId>, (usize, Keep)> = HashMap::new();
    for (k, ins) in tpl.instrs.iter().enumerate() {
        if let Some((operands, keep)) = forward_keep(tpl, ins) {
            open.insert(operands, (k, keep));
            continue;
        }
        let Some(operands) = grad_operands(ins) else {
            continue;
        };
        let Some((f, keep)) = open.remove(operands) else {
            continue;
        };
        let mut watched = operands.to_vec();
        watched.extend([keep.out, keep.stats]);
        if !touched(&tpl.instrs[f + 1..k], &watched) {
            kept.forward[f] = Some(keep);
            kept.grad[k] = Some(keep);
        }
    }
    kept
}

/// The statistics kept now, and the outputs held past their free for their gradient.
#[derive(Debug)]
pub struct Kept<T> {
    stats: HashMap<BufferId, T>,
    /// Outputs whose gradient will read them, by output: the statistic they go with.
    pending: HashMap<BufferId, BufferId>,
    /// Outputs the program freed before their gradient ran, by output.
    held: HashMap<BufferId, T>,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept {
            stats: HashMap::new(),
            pending: HashMap::new(),
            held: HashMap::new(),
        }
    }
}

impl<T> Kept<T> {
    /// Keeps `stats` for `keep`; returns what a recomputed forward's statistic replaced.
    pub fn keep(&mut self, keep: Keep, stats: T) -> Vec<T> {
        let mut old: Vec<T> = self.stats.insert(keep.stats, stats).into_iter().collect();
        old.extend(self.held.remove(&keep.out));
        self.pending.insert(keep.out, keep.stats);
        old
    }

    /// The program frees `buf`, whose buffer is `value`: held (`None` returned) where `buf` is
    /// an output its gradient has yet to read; else given back to be freed.
    pub fn free(&mut self, buf: BufferId, value: T) -> Option<T> {
        if self.pending.contains_key(&buf) && !self.held.contains_key(&buf) {
            self.held.insert(buf, value);
            return None;
        }
        Some(value)
    }

    /// The statistic of `keep` and its held output (`None`: the output is still the
    /// program's), taken for the gradient; `None` where nothing was kept.
    pub fn take(&mut self, keep: Keep) -> Option<(T, Option<T>)> {
        self.pending.remove(&keep.out);
        let held = self.held.remove(&keep.out);
        // An output is held only while its statistic is kept (`keep`, `free`).
        self.stats.remove(&keep.stats).map(|stats| (stats, held))
    }

    /// Everything still kept (to be freed: a step ends with nothing kept).
    pub fn drain(&mut self) -> Vec<T> {
        self.pending.clear();
        let mut all: Vec<T> = self.stats.drain().map(|(_, t)| t).collect();
        all.extend(self.held.drain().map(|(_, t)| t));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use program::{BufferDecl, Elem, TemplateId};

    fn b(i: u32) -> BufferId {
        BufferId(i)
    }

    const ATTENTION: OpKind = OpKind::Attention {
        heads: 2,
        kv_heads: 2,
        scale: 0.5,
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };

    fn forward(stats: u32) -> Instr {
        Instr::Compute {
            kind: ATTENTION,
            inputs: vec![b(0), b(1), b(2)],
            outputs: vec![b(3)],
            saves: vec![b(stats)],
            layer: Some(0),
        }
    }

    fn grad(wrt: Vec<usize>) -> Instr {
        Instr::Compute {
            kind: OpKind::Grad {
                of: Box::new(ATTENTION),
                wrt,
            },
            inputs: vec![b(0), b(1), b(2), b(4)],
            outputs: vec![b(5), b(6), b(7)],
            saves: vec![],
            layer: Some(0),
        }
    }

    /// q, k, v, out, dout, dq, dk, dv, then the row statistic (8) and a score buffer (9).
    fn template(instrs: Vec<Instr>) -> Template {
        let buffer = |shape: Vec<u64>, role| BufferDecl {
            name: String::new(),
            elem: Elem::F32,
            shape,
            role,
            partial: false,
        };
        let mut buffers: Vec<_> = (0..8)
            .map(|_| buffer(vec![1, 4, 8], Role::Activation))
            .collect();
        buffers.push(buffer(vec![1, 2, 4], Role::Saved));
        buffers.push(buffer(vec![1, 2, 4, 4], Role::Saved));
        Template {
            id: TemplateId(0),
            stage: 0,
            chunks: vec![0],
            buffers,
            shards: vec![],
            init: vec![],
            instrs,
        }
    }

    fn pairs(instrs: Vec<Instr>) -> (Vec<usize>, Vec<usize>) {
        let p = plan(&template(instrs));
        let at = |v: &[Option<Keep>]| {
            v.iter()
                .enumerate()
                .filter_map(|(k, x)| x.map(|_| k))
                .collect()
        };
        (at(&p.forward), at(&p.grad))
    }

    #[test]
    fn a_forward_pairs_with_the_gradient_on_its_operands() {
        let free_out = Instr::Free { buf: b(3) };
        assert_eq!(
            pairs(vec![forward(8), free_out.clone(), grad(vec![0, 1, 2])]),
            (vec![0], vec![2]),
            "the output freed before the gradient is held for it"
        );
        let p = plan(&template(vec![forward(8), grad(vec![0, 1, 2])]));
        assert_eq!(
            p.grad[1],
            Some(Keep {
                stats: b(8),
                out: b(3)
            })
        );
        // A recomputed forward replaces the first: the gradient reads the latest.
        assert_eq!(
            pairs(vec![forward(8), forward(8), grad(vec![0, 1, 2])]),
            (vec![1], vec![2])
        );
    }

    #[test]
    fn nothing_is_kept_where_the_statistic_could_be_stale_or_is_not_one() {
        let write = |buf: u32| Instr::Fill {
            buf: b(buf),
            value: 0.0,
        };
        let none = (vec![], vec![]);
        for between in [write(0), write(3), Instr::Alloc { buf: b(3) }] {
            assert_eq!(
                pairs(vec![forward(8), between.clone(), grad(vec![0, 1, 2])]),
                none,
                "{between:?} in between"
            );
        }
        assert_eq!(
            pairs(vec![forward(8), grad(vec![0, 1])]),
            none,
            "not all of q, k, v"
        );
        assert_eq!(
            pairs(vec![forward(9), grad(vec![0, 1, 2])]),
            none,
            "scores are no row statistic"
        );
        assert_eq!(pairs(vec![grad(vec![0, 1, 2]), forward(8)]), none);
    }

    #[test]
    fn an_output_freed_before_its_gradient_is_held_until_taken() {
        let keep = Keep {
            stats: b(8),
            out: b(3),
        };
        let mut kept = Kept::default();
        assert!(kept.keep(keep, "lse").is_empty());
        assert_eq!(kept.free(b(4), "other"), Some("other"), "not an output");
        assert_eq!(kept.free(b(3), "out"), None, "held");
        assert_eq!(kept.take(keep), Some(("lse", Some("out"))));
        assert_eq!(kept.take(keep), None, "taken once");
        assert_eq!(kept.free(b(3), "out again"), Some("out again"));
        // A recomputed forward gives back what the first kept.
        kept.keep(keep, "lse 1");
        kept.free(b(3), "out 1");
        let mut old = kept.keep(keep, "lse 2");
        old.sort_unstable();
        assert_eq!(old, ["lse 1", "out 1"]);
        assert_eq!(kept.drain(), ["lse 2"]);
        assert_eq!(kept.take(keep), None, "a step ends with nothing kept");
    }
}
