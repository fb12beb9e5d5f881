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
    /// first; the kinds below 0.5 % of the step are summed into one line. With `predicted`
    /// (seconds per step by kind, a plan's `kernel_s`), a last column gives the prediction of
    /// each kind beside its measurement, and a kind only predicted has a line of its own.
    pub fn table(&self, predicted: Option<&BTreeMap<String, f64>>) -> String {
        let steps = self.steps.max(1) as f64;
        let total = self.total_s.max(1e-12);
        // A kind the prediction does not name (a collective, priced apart) has no figure.
        let guess = |k: &str| predicted.and_then(|p| p.get(k).copied());
        let mut rows: Vec<Row> = self
            .by_kind
            .iter()
            .map(|(k, &(calls, s))| Row::new(k, calls as f64 / steps, s / steps, guess(k)))
            .collect();
        let only_predicted = predicted
            .into_iter()
            .flatten()
            .filter(|(k, _)| !self.by_kind.contains_key(*k));
        rows.extend(only_predicted.map(|(k, &p)| Row::new(k, 0.0, 0.0, Some(p))));
        rows.sort_by(|a, b| {
            b.s.max(b.predicted.unwrap_or(0.0))
                .total_cmp(&a.s.max(a.predicted.unwrap_or(0.0)))
        });
        let per_step = total / steps;
        let (shown, rest): (Vec<Row>, Vec<Row>) = rows
            .into_iter()
            .partition(|r| r.s.max(r.predicted.unwrap_or(0.0)) / per_step >= 0.005);
        let mut out = format!(
            "{:<28} {:>10} {:>12} {:>7}{}\n",
            "instruction",
            "calls/step",
            "ms/step",
            "share",
            if predicted.is_some() {
                "    predicted ms"
            } else {
                ""
            }
        );
        for r in &shown {
            out += &r.line(per_step);
        }
        if !rest.is_empty() {
            out += &Row::sum(&format!("({} more kinds)", rest.len()), &rest).line(per_step);
        }
        let counted: f64 = shown.iter().chain(&rest).map(|r| r.s).sum();
        let mut between = Row::new(
            "(between instructions)",
            0.0,
            (per_step - counted).max(0.0),
            None,
        );
        between.calls = None;
        out += &between.line(per_step);
        let mut step = Row::new("step", 0.0, per_step, predicted.map(|p| p.values().sum()));
        step.calls = None;
        out += step.line(per_step).trim_end();
        out
    }
}

/// One line of [`OpTimes::table`], per step.
struct Row {
    name: String,
    calls: Option<f64>,
    s: f64,
    predicted: Option<f64>,
}

impl Row {
    fn new(name: &str, calls: f64, s: f64, predicted: Option<f64>) -> Row {
        Row {
            name: name.to_string(),
            calls: Some(calls),
            s,
            predicted,
        }
    }

    /// The rows' calls and seconds summed under `name`.
    fn sum(name: &str, rows: &[Row]) -> Row {
        let add = |f: &dyn Fn(&Row) -> Option<f64>| rows.iter().filter_map(f).reduce(|a, b| a + b);
        Row {
            name: name.to_string(),
            calls: add(&|r| r.calls),
            s: add(&|r| Some(r.s)).unwrap_or(0.0),
            predicted: add(&|r| r.predicted),
        }
    }

    fn line(&self, per_step: f64) -> String {
        let calls = self.calls.map_or(String::new(), |c| format!("{c:.1}"));
        let predicted = self
            .predicted
            .map_or(String::new(), |p| format!(" {:>16.2}", 1e3 * p));
        format!(
            "{:<28} {calls:>10} {:>12.2} {:>6.1}%{predicted}\n",
            self.name,
            1e3 * self.s,
            100.0 * self.s / per_step.max(1e-12)
        )
    }
}
