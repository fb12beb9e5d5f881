//! A biased linear whose only reader is an addition (a projection's output added to the
//! residual stream) runs without its bias, and the addition adds it in the same pass
//! ([`Backend::forward_biased`]): the bias pass over the product (`add_bias`, a read and a
//! write of it) is gone. The sum's values are those of the bias added first and the sum after,
//! each rounded to f32, as the two instructions computed them.

use ir::OpKind;
use program::{BufferId, Instr};

use super::Executor;
use crate::{Backend, Communicator, RuntimeError};

/// A linear run without its bias: the addition that reads its output adds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BiasSum {
    /// The linear's output.
    pub product: BufferId,
    /// Its bias.
    pub bias: BufferId,
    /// The addition's step instruction.
    pub sum_at: usize,
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Per step instruction, the [`BiasSum`] a biased linear is part of: the next instruction
    /// to touch its output is an addition of it and another operand of its shape into a third
    /// buffer, after which the program frees it unread; nothing writes the bias in between, the
    /// stash does not hold the output, and the linear's result is made no other fused way.
    /// Empty where the backend adds no bias in a sum.
    pub(super) fn bias_sums(&self) -> Vec<Option<BiasSum>> {
        let instrs = &self.tpl.instrs;
        if !self.backend.sums_with_bias() {
            return vec![None; instrs.len()];
        }
        (0..instrs.len()).map(|k| self.bias_sum(k)).collect()
    }

    fn bias_sum(&self, k: usize) -> Option<BiasSum> {
        let instrs = &self.tpl.instrs;
        let Instr::Compute {
            kind: OpKind::Linear { bias: true },
            inputs,
            outputs,
            ..
        } = &instrs[k]
        else {
            return None;
        };
        let (&[_, _, bias], &[product]) = (inputs.as_slice(), outputs.as_slice()) else {
            return None;
        };
        let fused = [&self.step_words, &self.step_twins, &self.step_pitched]
            .iter()
            .any(|v| v.get(k).copied().unwrap_or(false));
        if fused || inputs.contains(&product) {
            return None;
        }
        let touches = |ins: &Instr, b: BufferId| {
            let (reads, writes) = program::verify::operands(ins);
            reads.contains(&b)
                || writes.contains(&b)
                || matches!(ins, Instr::Alloc { buf } | Instr::Free { buf } if *buf == b)
        };
        let sum_at = k + 1 + instrs[k + 1..].iter().position(|i| touches(i, product))?;
        let Instr::Compute {
            kind: OpKind::Add,
            inputs: operands,
            outputs: sum,
            saves,
            ..
        } = &instrs[sum_at]
        else {
            return None;
        };
        let other = match *operands.as_slice() {
            [a, b] if a == product && b != product => b,
            [a, b] if b == product && a != product => a,
            _ => return None,
        };
        let shape = |b: BufferId| self.tpl.buffer(b).map(|d| d.shape.clone());
        let laid_out = sum.len() == 1
            && !sum.contains(&product)
            && saves.is_empty()
            && shape(other).is_some()
            && shape(other) == shape(product)
            && shape(sum[0]) == shape(product);
        // The addition's other operand holds values (not pending zeros it would be moved for).
        let zeroed = super::moves::zeroed_when_reached(&instrs[..sum_at], other);
        let bias_kept = !instrs[k + 1..sum_at].iter().any(|i| {
            let (_, writes) = program::verify::operands(i);
            writes.contains(&bias)
        });
        let freed_next = matches!(
            instrs[sum_at + 1..].iter().find(|i| touches(i, product)),
            Some(Instr::Free { .. })
        );
        let stashed = self
            .stash_plan
            .after
            .get(k..=sum_at)
            .is_some_and(|ls| ls.iter().flatten().any(|b| *b == product));
        (laid_out && !zeroed && bias_kept && freed_next && !stashed).then_some(BiasSum {
            product,
            bias,
            sum_at,
        })
    }

    /// Runs step instruction `k` where it is part of a [`BiasSum`]: the linear without its
    /// bias (noting the bias for the sum), or the sum adding it; `false` where it is neither.
    pub(super) fn run_bias_sum(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        let Some((kind, inputs, outputs)) = super::made::compute_parts(ins) else {
            return Ok(false);
        };
        for &b in inputs {
            if self.unbiased.contains_key(&b) {
                return self.run_sum_adding_bias(k, kind, inputs, outputs);
            }
        }
        let Some(bs) = self.step_bias_sums.get(k).copied().flatten() else {
            return Ok(false);
        };
        self.zero_pending(inputs)?;
        let binding = ir::Binding {
            batch: self.set.mesh.micro_batch,
            seq: self.set.mesh.seq,
        };
        let unbiased = OpKind::Linear { bias: false };
        let operands = self.buffers(inputs.get(..2).unwrap_or(inputs))?;
        let mut product = self.backend.forward(&unbiased, &operands, binding)?;
        let (Some(y), true) = (product.pop(), product.is_empty()) else {
            return Err(self.prog("a linear without its bias gave other than one result"));
        };
        self.put_buffer(bs.product, y)?;
        self.unbiased.insert(bs.product, (bs.bias, bs.sum_at));
        Ok(true)
    }

    /// The addition at step instruction `k` of a product still without its bias (noted by the
    /// linear): the bias added in the same pass, with the result's twin where the twin
    /// analysis chose it ([`super::twins`]).
    fn run_sum_adding_bias(
        &mut self,
        k: usize,
        kind: &OpKind,
        inputs: &[BufferId],
        outputs: &[BufferId],
    ) -> Result<bool, RuntimeError> {
        let side = inputs
            .iter()
            .position(|b| self.unbiased.contains_key(b))
            .unwrap_or(0);
        let (bias, at) = self
            .unbiased
            .remove(&inputs[side])
            .unwrap_or((inputs[side], k));
        let &[out] = outputs else {
            return Err(self.prog("an addition of a product without its bias has one result"));
        };
        if at != k {
            return Err(self.prog(format!(
                "a product without its bias read at step instruction {k}, planned for {at}"
            )));
        }
        self.zero_pending(inputs)?;
        let twin = self.step_twins.get(k).copied().unwrap_or(false);
        let sum = self.backend.forward_biased(
            kind,
            &self.buffers(inputs)?,
            (side, self.get(bias)?),
            twin,
        )?;
        let Some(sum) = sum else {
            return Err(self.prog(format!(
                "step instruction {k}: the backend did not add a linear's bias in the sum after it"
            )));
        };
        self.put_buffer(out, sum)?;
        Ok(true)
    }
}
