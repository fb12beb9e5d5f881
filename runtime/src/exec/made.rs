//! What the fused ways of running a step instruction share (results made as words alone,
//! held at a pitch, made with their twin: [`super::words_only`], [`super::pitched`],
//! [`super::twins`]): asking the backend, per operand position, how an instruction reads a
//! buffer, and running the instruction through a backend method that makes its results.

use ir::OpKind;
use program::{BufferId, Instr};

use super::Executor;
use crate::{Backend, Communicator, RuntimeError};

/// A computation's op, operands and results, where `ins` is one.
pub(super) fn compute_parts(ins: &Instr) -> Option<(&OpKind, &[BufferId], &[BufferId])> {
    match ins {
        Instr::Compute {
            kind,
            inputs,
            outputs,
            ..
        } => Some((kind, inputs, outputs)),
        _ => None,
    }
}

/// The operands and results of an instruction whose results a fused way may make, or `None`
/// for another ([`Executor::results_read_only`]).
pub(super) type MadeBy = fn(&Instr) -> Option<(&[BufferId], &[BufferId])>;

/// A computation's operands and results.
pub(super) fn computed(ins: &Instr) -> Option<(&[BufferId], &[BufferId])> {
    compute_parts(ins).map(|(_, inputs, outputs)| (inputs, outputs))
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Zero-fills each of `ids` that holds pending zeros (an allocation never written reads as
    /// zeros, as in `exec`), for a fused path about to read them ([`Executor::buffers`]).
    pub(super) fn zero_pending(&mut self, ids: &[BufferId]) -> Result<(), RuntimeError> {
        ids.iter().try_for_each(|&b| self.zero_if_pending(b))
    }

    /// The buffers `ids` names, in order.
    pub(super) fn buffers(&self, ids: &[BufferId]) -> Result<Vec<&B::Buffer>, RuntimeError> {
        ids.iter().map(|&i| self.get(i)).collect()
    }

    /// Whether `ins` is a computation that reads `b` at each position it takes it as `reads`
    /// says (from the op, the declared shapes of its inputs and the position).
    pub(super) fn reads_each_position(
        &self,
        ins: &Instr,
        b: BufferId,
        reads: impl Fn(&B, &OpKind, &[&[usize]], usize) -> bool,
    ) -> bool {
        let Instr::Compute { kind, inputs, .. } = ins else {
            return false;
        };
        let Ok(shapes) = inputs
            .iter()
            .map(|&i| self.decl_shape(i))
            .collect::<Result<Vec<_>, _>>()
        else {
            return false;
        };
        let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        let mut positions = inputs.iter().enumerate().filter(|(_, i)| **i == b);
        positions.all(|(p, _)| reads(&self.backend, kind, &shapes, p))
    }

    /// Runs computation `ins` where `chosen`, by `make` on its operands (an allocation never
    /// written reads as zeros, as in `exec`), and puts the results in place of its outputs,
    /// each then marked by `mark`; `false` where not chosen, not a computation, or `make`
    /// makes none (or not one a result): it then runs as usual.
    pub(super) fn run_made(
        &mut self,
        ins: &Instr,
        chosen: bool,
        make: impl FnOnce(&B, &OpKind, &[&B::Buffer]) -> Result<Option<Vec<B::Buffer>>, RuntimeError>,
        mark: impl Fn(&mut Self, BufferId),
    ) -> Result<bool, RuntimeError> {
        let Some((kind, inputs, outputs)) = compute_parts(ins) else {
            return Ok(false);
        };
        if !chosen {
            return Ok(false);
        }
        self.zero_pending(inputs)?;
        let results = make(&self.backend, kind, &self.buffers(inputs)?)?;
        let Some(results) = results.filter(|r| r.len() == outputs.len()) else {
            return Ok(false);
        };
        for (t, &o) in results.into_iter().zip(outputs) {
            self.put_buffer(o, t)?;
            mark(self, o);
        }
        Ok(true)
    }
}
