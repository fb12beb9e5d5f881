//! A bf16 plan's activations held as bf16 between distant uses.
//!
//! The planner prices a mixed-precision plan's activations, their gradients, the parameters'
//! compute copies and (where it says so) the parameters' gradients in bf16 (the buffers'
//! declared `Elem::Bf16`, as Megatron-LM and torchtitan store them), while plait's device
//! kernels read and write f32. A buffer whose next use is at least [`STASH_GAP`]
//! instructions after the last (typically a forward activation the backward reads again) is
//! rounded to bf16 words once that use is done ([`Backend::stash_bf16`]) and expanded to f32
//! just before the next ([`Backend::unstash_bf16`]), so the memory it holds across the gap is
//! the plan's. Buffers used again soon stay f32: converting them would cost two passes over
//! memory and save nothing at the peak. On a backend that keeps f32 only (the CPU) nothing
//! changes.
//!
//! [`Backend::stash_bf16`]: crate::Backend::stash_bf16
//! [`Backend::unstash_bf16`]: crate::Backend::unstash_bf16

use program::{BufferId, Elem, Instr, Role, Template};

/// The fewest instructions between two uses of a buffer for it to be stashed in between: more
/// than one transformer layer's forward (about 40 instructions in GPT-2's programs), so a
/// layer's own short-lived values stay f32 and the activations its backward reads, a few
/// hundred to thousands of instructions later, are stashed.
pub const STASH_GAP: usize = 64;

/// Where buffers are stashed and which instructions expand them: computed once per template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StashPlan {
    /// Per instruction, the buffers to stash once it has run (their next use is at least
    /// `STASH_GAP` instructions later).
    pub after: Vec<Vec<BufferId>>,
    /// Per instruction, the buffers it uses (reads or writes) that are stashed at that point:
    /// expanded before it runs.
    pub before: Vec<Vec<BufferId>>,
}

/// Whether `b` holds a value the plan stores in bf16: an activation, a gradient flowing
/// backward, a parameter's compute copy (the optimizer updates the f32 master and writes it
/// back; between its forward and backward uses it is the bf16 copy a mixed-precision engine
/// holds) or a parameter's gradient where the plan accumulates it in bf16. Master weights and
/// optimizer state are f32 and never stashed. Nor are vectors (norm weights, biases and
/// their gradients: one element per feature, where a model's matrices and activations hold
/// thousands): a stash and its expansion are two launches, bound by launch latency at that
/// size (a few microseconds each on a GPU), to save a few KiB, and GPT-2's step ran about
/// 290 such pairs. A step ends with nothing stashed (`Executor::step`).
fn stashable(tpl: &Template, b: BufferId) -> bool {
    tpl.buffer(b).is_some_and(|d| {
        d.elem == Elem::Bf16
            && d.shape.len() >= 2
            && !d.partial
            && matches!(
                d.role,
                Role::Activation | Role::ActGrad | Role::Param(_) | Role::Grad(_)
            )
    })
}

/// The buffers `ins` reads or writes.
fn uses(ins: &Instr) -> Vec<BufferId> {
    let (reads, writes) = program::verify::operands(ins);
    let mut all = reads;
    all.extend(writes);
    all
}

/// The stash points of `tpl`'s step instructions: a buffer is stashed after a use whose next
/// use comes `STASH_GAP` or more instructions later, and expanded before that next use (never
/// across its free or a new allocation, which end its value).
pub fn plan(tpl: &Template) -> StashPlan {
    let n = tpl.instrs.len();
    let mut after = vec![Vec::new(); n];
    let mut before = vec![Vec::new(); n];
    // The last use of each buffer since its allocation.
    let mut last: Vec<Option<usize>> = vec![None; tpl.buffers.len()];
    for (k, ins) in tpl.instrs.iter().enumerate() {
        if let Instr::Alloc { buf } | Instr::Free { buf } = ins {
            if let Some(slot) = last.get_mut(buf.index()) {
                *slot = None;
            }
            continue;
        }
        for b in uses(ins) {
            let Some(slot) = last.get_mut(b.index()) else {
                continue;
            };
            if let Some(i) = *slot
                && k - i >= STASH_GAP
                && stashable(tpl, b)
            {
                if !after[i].contains(&b) {
                    after[i].push(b);
                }
                if !before[k].contains(&b) {
                    before[k].push(b);
                }
            }
            *slot = Some(k);
        }
    }
    StashPlan { after, before }
}
