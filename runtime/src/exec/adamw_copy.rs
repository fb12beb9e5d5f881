//! A mixed-precision program updates each master weight (`AdamW`) and then copies it to the
//! parameter's compute copy (`Copy`). Where the backend can ([`Backend::adamw_copy`]: the
//! device), the executor runs the pair as one pass that also writes the copy, and its bf16
//! twin where a bf16 GEMM reads it next: a GPT-2 step otherwise launched 148 copies after its
//! 148 updates, and the next forward converted every weight again.

use program::{BufferId, Instr};

use super::Executor;
use crate::{Backend, Communicator, RuntimeError};

/// Per step instruction: the copy's destination where the instruction is an `AdamW` whose
/// next instruction copies the updated parameter elsewhere.
pub fn adamw_copies(instrs: &[Instr]) -> Vec<Option<BufferId>> {
    let mut out = vec![None; instrs.len()];
    for (k, pair) in instrs.windows(2).enumerate() {
        if let [Instr::AdamW { param, .. }, Instr::Copy { src, dst }] = pair
            && src == param
            && dst != param
        {
            out[k] = Some(*dst);
        }
    }
    out
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Runs `AdamW` `ins` together with the copy of its parameter into `dst` that follows it;
    /// `false`: the backend does not (nothing done; the two run as written).
    pub(super) fn run_adamw_copy(
        &mut self,
        ins: &Instr,
        dst: BufferId,
    ) -> Result<bool, RuntimeError> {
        let Instr::AdamW {
            config,
            param,
            grad,
            m,
            v,
        } = ins
        else {
            return Ok(false);
        };
        // As `exec` does for every operand: an allocation never written reads as zeros (a
        // gradient nothing contributed to this step).
        for b in [*param, *grad, *m, *v] {
            self.zero_if_pending(b)?;
        }
        let [p, mm, vv] =
            [*param, *m, *v].map(|b| self.bufs.get_mut(b.index()).and_then(Option::take));
        let (Some(mut p), Some(mut mm), Some(mut vv)) = (p, mm, vv) else {
            return Err(self.prog(format!(
                "adamw: buffer {param}, {m} or {v} is not allocated"
            )));
        };
        let frozen = self.frozen_variance(*grad);
        // The copy overwrites the destination whole: a stash of its old value is dead.
        if let Some(words) = self.stashed.get_mut(dst.index()).and_then(Option::take) {
            self.backend.free(words);
        }
        let mut copy = self.bufs.get_mut(dst.index()).and_then(Option::take);
        let done = self.get(*grad).and_then(|g| {
            self.backend.adamw_copy(
                config,
                [&mut p, &mut mm, &mut vv],
                g,
                (self.steps, frozen),
                &mut copy,
            )
        });
        for (b, t) in [(*param, p), (*m, mm), (*v, vv)] {
            if let Some(s) = self.bufs.get_mut(b.index()) {
                *s = Some(t);
            }
        }
        let done = done?;
        match copy {
            Some(c) if done => self.put_buffer(dst, c)?,
            // Not done: the destination goes back as it was, for the copy to write.
            c => {
                if let Some(s) = self.bufs.get_mut(dst.index()) {
                    *s = c;
                }
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_update_followed_by_a_copy_of_its_parameter_pairs() {
        let b = BufferId;
        let adamw = |p: u32| Instr::AdamW {
            config: ir::AdamWConfig::default(),
            param: b(p),
            grad: b(10),
            m: b(11),
            v: b(12),
        };
        let copy = |src: u32, dst: u32| Instr::Copy {
            src: b(src),
            dst: b(dst),
        };
        let program = [
            adamw(0),
            copy(0, 1), // the pair
            adamw(2),
            copy(3, 4), // another buffer's copy
            adamw(5),
            Instr::Free { buf: b(9) },
            copy(5, 6), // not next
            adamw(7),
            copy(7, 7), // onto itself
        ];
        assert_eq!(
            adamw_copies(&program),
            [Some(b(1)), None, None, None, None, None, None, None, None]
        );
    }
}
