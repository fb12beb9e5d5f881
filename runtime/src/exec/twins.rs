//! Results made with their bf16 twin in the same launch ([`Backend::forward_with_twin`]): a
//! result of a bf16 plan that the executor stashes before its value ends (a residual add's
//! output, which the backward reads hundreds of instructions on), or that a linear's
//! gradient reads as its output gradient (a residual gradient's sum, which both of that
//! gradient's products read as bf16), would otherwise be read again by a `to_bf16` pass that
//! rounds it. The kernel that computes it writes the rounded words too, while the values are in
//! registers: the stash keeps them and the GEMMs take them as they are.

use program::{BufferId, Instr};

use super::Executor;
use crate::{Backend, Communicator, RuntimeError};

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Per step instruction, whether its result (one) is made with
    /// its twin: it is stashed (after this instruction or a later one) before its value ends,
    /// or a later reader reads it as a linear's output gradient through the twin. Until then
    /// every other reader reads its f32 values, and nothing writes it in place (that would end
    /// the value). Instructions whose results are made as words alone
    /// ([`Executor::word_results`]) are not. One pass from the last instruction back.
    pub(super) fn twin_results(&self) -> Vec<bool> {
        let instrs = &self.tpl.instrs;
        // Per buffer: its value from here on is stashed, or read through its twin, before it ends.
        let mut wanted = vec![false; self.tpl.buffers.len()];
        let mut out = vec![false; instrs.len()];
        let mark = |bufs: &mut Vec<bool>, b: BufferId, v: bool| {
            if let Some(w) = bufs.get_mut(b.index()) {
                *w = v;
            }
        };
        for (k, ins) in instrs.iter().enumerate().rev() {
            for &b in self.stash_plan.after.get(k).map_or(&[][..], Vec::as_slice) {
                mark(&mut wanted, b, true);
            }
            // An instruction that reads its own output (an accumulation) makes a new value of
            // it all the same: the backend's ops write only buffers they allocate.
            if let Instr::Compute { outputs, .. } = ins
                && let &[o] = outputs.as_slice()
            {
                let ahead = wanted.get(o.index()).copied().unwrap_or(false);
                let words = self.step_words.get(k).copied().unwrap_or(false);
                out[k] = !words && ahead;
            }
            // A buffer handed on whole (a move, or a free that hands it to a deferred copy's
            // receiver) carries its twin: it is wanted as its new name is.
            let handed = self.handed_on(k, ins);
            let carried = handed.map(|(_, to)| wanted.get(to.index()).copied().unwrap_or(false));
            let (reads, writes) = program::verify::operands(ins);
            let ended = match ins {
                Instr::Alloc { buf } | Instr::Free { buf } => vec![*buf],
                _ => writes,
            };
            for b in ended {
                mark(&mut wanted, b, false);
            }
            if let (Some((from, _)), Some(v)) = (handed, carried) {
                mark(&mut wanted, from, v);
            }
            for b in reads {
                if self.reads_as_output_gradient(ins, b) {
                    mark(&mut wanted, b, true);
                }
            }
        }
        out
    }

    /// `(buffer, new name)` where step instruction `k` hands a buffer on whole: a copy that
    /// moves it, or the free that hands it to a deferred copy's receiver ([`super::moves`]).
    fn handed_on(&self, k: usize, ins: &Instr) -> Option<(BufferId, BufferId)> {
        match ins {
            Instr::Copy { src, dst } if self.step_moves.get(k).copied().unwrap_or(false) => {
                Some((*src, *dst))
            }
            Instr::Free { buf } => self
                .step_deferred
                .iter()
                .flatten()
                .find(|d| d.free_at == k && d.moved == *buf)
                .map(|d| (d.moved, d.to)),
            _ => None,
        }
    }

    /// Whether `ins` is a linear's (or product's) gradient that reads `b` as its output
    /// gradient only as bf16 words ([`Backend::reads_stashed_words`]: through its twin).
    fn reads_as_output_gradient(&self, ins: &Instr, b: BufferId) -> bool {
        let Instr::Compute { kind, inputs, .. } = ins else {
            return false;
        };
        let ir::OpKind::Grad { of, .. } = kind else {
            return false;
        };
        if !matches!(**of, ir::OpKind::Linear { .. } | ir::OpKind::MatMul)
            || inputs.last() != Some(&b)
            || inputs[..inputs.len() - 1].contains(&b)
        {
            return false;
        }
        self.reads_words_only(ins, b)
    }

    /// Runs step instruction `k` where [`Executor::twin_results`] chose it and the backend
    /// makes its result with its twin; `false`: not here (it runs as usual).
    pub(super) fn run_twin(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        let chosen = self.step_twins.get(k).copied().unwrap_or(false);
        self.run_made(
            ins,
            chosen,
            |b, kind, xs| Ok(b.forward_with_twin(kind, xs)?.map(|y| vec![y])),
            |_, _| {},
        )
    }
}
