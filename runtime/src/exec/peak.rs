//! Where a step's memory peak is reached: the step instruction during which the device
//! allocator's high-water mark last rose (its temporaries included), so that `plait run` can
//! say which instruction to look at when the measured peak differs from the plan's.

/// An instruction that raised the allocator's high-water mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakAt {
    /// The instruction's index among the step's (`plait show`'s `step` numbers).
    pub index: usize,
    /// Its kind, as `--op-times` names it.
    pub kind: String,
    /// The high-water mark after it ran, bytes in buffers.
    pub bytes: u64,
}

/// Keeps `at` as the peak when it raised the mark past `peak`'s.
pub(super) fn note(peak: &mut Option<PeakAt>, at: PeakAt) {
    if peak.as_ref().is_none_or(|p| at.bytes > p.bytes) {
        *peak = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::{PeakAt, note};

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
            note(&mut peak, PeakAt { index, kind, bytes });
        }
        let want = PeakAt {
            index: 7,
            kind: "op7".into(),
            bytes: 12 << 30,
        };
        assert_eq!(peak, Some(want));
    }
}
