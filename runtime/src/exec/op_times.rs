//! Where a rank's step time goes: wall time per kind of instruction (`plait run --op-times`).
//!
//! Collectives and receives include the time spent waiting for the other ranks, so on a
//! pipeline or a loaded machine they also measure imbalance, not only transfer.

use std::collections::BTreeMap;
use std::time::Duration;

use ir::OpKind;
use program::Instr;

/// Calls and wall time per instruction kind, over the steps recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpTimes {
    /// Kind → (calls, seconds).
    pub by_kind: BTreeMap<String, (u64, f64)>,
    /// Steps recorded.
    pub steps: u64,
    /// Wall time of those steps.
    pub total_s: f64,
    /// Step instruction index → (kind, seconds): which single instructions cost most.
    pub by_index: BTreeMap<usize, (String, f64)>,
}

/// The kind an instruction is counted under: the op's name for computes (`grad.` prefixed for
/// backward ops), the operation and communicator role for collectives, else the
/// instruction's name (as errors give it).
pub fn kind(i: &Instr) -> String {
    match i {
        Instr::Compute {
            kind: OpKind::Grad { of, .. },
            ..
        } => format!("grad.{}", of.mnemonic()),
        Instr::Context {
            kind: OpKind::Grad { of, .. },
            ..
        } => format!("grad.{} (cp)", of.mnemonic()),
        Instr::Compute { kind, .. } => kind.mnemonic().to_string(),
        Instr::Context { kind, .. } => format!("{} (cp)", kind.mnemonic()),
        Instr::Collective { op, group, .. } => format!("{} ({})", op.name(), group.name()),
        _ => super::instr_name(i).to_string(),
    }
}

impl OpTimes {
    /// Instruction `index` of the step, of `kind`, took `took`.
    pub(crate) fn add(&mut self, index: usize, kind: String, took: Duration) {
        let e = self.by_kind.entry(kind.clone()).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += took.as_secs_f64();
        self.by_index.entry(index).or_insert((kind, 0.0)).1 += took.as_secs_f64();
    }

    /// The `n` instructions that took longest per step: index in the step (the numbers of
    /// `plait show`'s `step` lines), kind and milliseconds, one a line.
    pub fn slowest(&self, n: usize) -> String {
        let steps = self.steps.max(1) as f64;
        let mut rows: Vec<(&usize, &(String, f64))> = self.by_index.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        rows.iter()
            .take(n)
            .map(|(i, (k, s))| format!("step {i:>6}  {k:<28} {:>9.3} ms", 1e3 * s / steps))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(crate) fn end_step(&mut self, took: Duration) {
        self.steps += 1;
        self.total_s += took.as_secs_f64();
    }

    /// A table: kind, calls per step, milliseconds per step and share of the step, largest
    /// first; the kinds below 0.5 % of the step are summed into one line.
    pub fn table(&self) -> String {
        let steps = self.steps.max(1) as f64;
        let total = self.total_s.max(1e-12);
        let mut rows: Vec<(&String, &(u64, f64))> = self.by_kind.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        let mut out = format!(
            "{:<28} {:>10} {:>12} {:>7}\n",
            "instruction", "calls/step", "ms/step", "share"
        );
        let (mut rest_calls, mut rest_s, mut rest_n) = (0u64, 0.0, 0usize);
        let mut counted = 0.0;
        for (k, &(calls, s)) in rows {
            counted += s;
            if s / total < 0.005 {
                (rest_calls, rest_s, rest_n) = (rest_calls + calls, rest_s + s, rest_n + 1);
                continue;
            }
            out += &format!(
                "{k:<28} {:>10.1} {:>12.2} {:>6.1}%\n",
                calls as f64 / steps,
                1e3 * s / steps,
                100.0 * s / total
            );
        }
        if rest_n > 0 {
            out += &format!(
                "{:<28} {:>10.1} {:>12.2} {:>6.1}%\n",
                format!("({rest_n} more kinds)"),
                rest_calls as f64 / steps,
                1e3 * rest_s / steps,
                100.0 * rest_s / total
            );
        }
        let other = (total - counted).max(0.0);
        out += &format!(
            "{:<28} {:>10} {:>12.2} {:>6.1}%\n{:<28} {:>10} {:>12.2}",
            "(between instructions)",
            "",
            1e3 * other / steps,
            100.0 * other / total,
            "step",
            "",
            1e3 * total / steps
        );
        out
    }
}
