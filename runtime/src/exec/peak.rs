//! Where a step's memory peak is reached: the step instruction during which the device
//! allocator's high-water mark last rose (its temporaries included), so that `plait run` can
//! say which instruction to look at when the measured peak differs from the plan's.

use program::Role;

/// An instruction that raised the allocator's high-water mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakAt {
    /// The instruction's index among the step's (`plait show`'s `step` numbers).
    pub index: usize,
    /// Its kind, as `--op-times` names it.
    pub kind: String,
    /// The high-water mark after it ran, bytes in buffers.
    pub bytes: u64,
    /// The program's buffers live once it had run, bytes by [`role_class`] (largest first):
    /// the mark less their sum is what the instruction held only while it ran (its
    /// temporaries, and buffers it freed).
    pub live: Vec<(&'static str, u64)>,
}

/// The class of memory a buffer of `role` is, as the plan's peak itemizes it.
pub fn role_class(role: &Role) -> &'static str {
    match role {
        Role::Param(_) | Role::ParamSlice(_) | Role::Fp8Copy(_) => "parameters",
        Role::Master(_) => "master weights",
        Role::OptM(_) | Role::OptV(_) => "optimizer state",
        Role::Grad(_) | Role::GradSlice(_) | Role::GradPart(_) => "gradients",
        Role::Activation | Role::Saved => "activations",
        Role::ActGrad => "activation gradients",
        Role::Tokens | Role::Loss | Role::Reserve | Role::Temp => "other",
    }
}

/// `bytes` by class, summed and sorted, largest first.
pub fn by_class(bytes: impl IntoIterator<Item = (&'static str, u64)>) -> Vec<(&'static str, u64)> {
    let mut sums: Vec<(&'static str, u64)> = Vec::new();
    for (class, b) in bytes {
        match sums.iter_mut().find(|(c, _)| *c == class) {
            Some((_, total)) => *total += b,
            None => sums.push((class, b)),
        }
    }
    sums.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    sums
}

/// Keeps `at` as the peak when it raised the mark past `peak`'s.
pub(super) fn note(peak: &mut Option<PeakAt>, at: PeakAt) {
    if peak.as_ref().is_none_or(|p| at.bytes > p.bytes) {
        *peak = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::{PeakAt, by_class, note};

    #[test]
    fn the_peak_is_the_instruction_that_raised_the_high_water_mark() {
        let mut peak = None;
        for (index, bytes) in [
            (3, 10u64 << 30),
            (7, 12 << 30),
            (9, 12 << 30),
            (11, 11 << 30),
        ] {
            let kind = format!("op{index}");
            let live = Vec::new();
            note(
                &mut peak,
                PeakAt {
                    index,
                    kind,
                    bytes,
                    live,
                },
            );
        }
        let want = PeakAt {
            index: 7,
            kind: "op7".into(),
            bytes: 12 << 30,
            live: Vec::new(),
        };
        assert_eq!(peak, Some(want));
    }

    #[test]
    fn live_bytes_sum_by_class_largest_first() {
        let sums = by_class([("gradients", 2), ("activations", 5), ("gradients", 4)]);
        assert_eq!(sums, vec![("gradients", 6), ("activations", 5)]);
    }
}
