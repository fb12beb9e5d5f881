//! Where a rank's step time goes: wall time per kind of instruction (`plait run --op-times`).
//!
//! Collectives and receives include the time spent waiting for the other ranks, so on a
//! pipeline or a loaded machine they also measure imbalance, not only transfer.

use std::collections::BTreeMap;
use std::time::Duration;

use ir::OpKind;
use program::Instr;

use crate::backend::launches::LaunchTally;

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
    /// Kind → (kernel launches, bytes of the buffers they were handed), on a backend that
    /// counts its launches (the CUDA and dry devices: [`crate::backend::launches`]).
    pub launches: BTreeMap<String, (u64, u64)>,
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

    /// Instruction kind `kind` launched `tally`'s kernels.
    pub(crate) fn add_launches(&mut self, kind: &str, tally: &LaunchTally) {
        let e = self.launches.entry(kind.to_string()).or_default();
        e.0 += tally.launches();
        e.1 += tally.bytes();
    }

    pub(crate) fn end_step(&mut self, took: Duration) {
        self.steps += 1;
        self.total_s += took.as_secs_f64();
    }

    /// A table: kind, calls per step, milliseconds per step and share of the step, largest
    /// first; the kinds below 0.5 % of the step are summed into one line. Where the backend
    /// counts its launches, each kind's kernel launches and the gigabytes of buffers they were
    /// handed per step, and those over its time (an upper bound on the bandwidth it reached).
    /// With `predicted` (seconds per step by kind, a plan's `kernel_s`), a last column gives
    /// the prediction of each kind beside its measurement, and a kind only predicted has a
    /// line of its own.
    pub fn table(&self, predicted: Option<&BTreeMap<String, f64>>) -> String {
        let steps = self.steps.max(1) as f64;
        let per_step = self.total_s.max(1e-12) / steps;
        let cols = Columns {
            launches: !self.launches.is_empty(),
            predicted: predicted.is_some(),
        };
        // A kind the prediction does not name (a collective, priced apart) has no figure.
        let guess = |k: &str| predicted.and_then(|p| p.get(k).copied());
        let mut rows: Vec<Row> = self
            .by_kind
            .iter()
            .map(|(k, &(calls, s))| Row {
                calls: Some(calls as f64 / steps),
                traffic: self
                    .launches
                    .get(k)
                    .map(|&(n, bytes)| (n as f64 / steps, bytes as f64 / steps)),
                ..Row::new(k, s / steps, guess(k))
            })
            .collect();
        let only_predicted = predicted
            .into_iter()
            .flatten()
            .filter(|(k, _)| !self.by_kind.contains_key(*k));
        rows.extend(only_predicted.map(|(k, &p)| Row::new(k, 0.0, Some(p))));
        rows.sort_by(|a, b| b.weight().total_cmp(&a.weight()));
        let (shown, rest): (Vec<Row>, Vec<Row>) = rows
            .into_iter()
            .partition(|r| r.weight() / per_step >= 0.005);
        let mut out = cols.header();
        for r in &shown {
            out += &r.line(per_step, cols);
        }
        if !rest.is_empty() {
            out += &Row::sum(&format!("({} more kinds)", rest.len()), &rest).line(per_step, cols);
        }
        let counted: f64 = shown.iter().chain(&rest).map(|r| r.s).sum();
        let between = (per_step - counted).max(0.0);
        out += &Row::new("(between instructions)", between, None).line(per_step, cols);
        let step = Row::new("step", per_step, predicted.map(|p| p.values().sum()));
        out += step.line(per_step, cols).trim_end();
        out
    }
}

/// Which of [`OpTimes::table`]'s optional columns it has.
#[derive(Clone, Copy)]
struct Columns {
    launches: bool,
    predicted: bool,
}

impl Columns {
    fn header(self) -> String {
        let mut h = format!(
            "{:<28} {:>10} {:>12} {:>7}",
            "instruction", "calls/step", "ms/step", "share"
        );
        if self.launches {
            h += &format!(" {:>10} {:>9} {:>8}", "launches", "GB/step", "GB/s");
        }
        if self.predicted {
            h += &format!(" {:>14}", "predicted ms");
        }
        h + "\n"
    }
}

/// One line of [`OpTimes::table`], per step.
struct Row {
    name: String,
    calls: Option<f64>,
    s: f64,
    /// Kernel launches and the bytes they were handed.
    traffic: Option<(f64, f64)>,
    predicted: Option<f64>,
}

impl Row {
    fn new(name: &str, s: f64, predicted: Option<f64>) -> Row {
        Row {
            name: name.to_string(),
            calls: None,
            s,
            traffic: None,
            predicted,
        }
    }

    /// What orders the rows: the larger of the measurement and the prediction.
    fn weight(&self) -> f64 {
        self.s.max(self.predicted.unwrap_or(0.0))
    }

    /// The rows' calls, seconds, launches and predictions summed under `name`.
    fn sum(name: &str, rows: &[Row]) -> Row {
        let add = |f: &dyn Fn(&Row) -> Option<f64>| rows.iter().filter_map(f).reduce(|a, b| a + b);
        let launches = add(&|r| r.traffic.map(|t| t.0));
        Row {
            name: name.to_string(),
            calls: add(&|r| r.calls),
            s: add(&|r| Some(r.s)).unwrap_or(0.0),
            traffic: launches.map(|n| (n, add(&|r| r.traffic.map(|t| t.1)).unwrap_or(0.0))),
            predicted: add(&|r| r.predicted),
        }
    }

    fn line(&self, per_step: f64, cols: Columns) -> String {
        let blank = |w: usize| " ".repeat(w);
        let calls = self.calls.map_or(String::new(), |c| format!("{c:.1}"));
        let mut l = format!(
            "{:<28} {calls:>10} {:>12.2} {:>6.1}%",
            self.name,
            1e3 * self.s,
            100.0 * self.s / per_step.max(1e-12)
        );
        if cols.launches {
            l += &self.traffic.map_or(blank(30), |(n, bytes)| {
                let rate = if self.s > 0.0 {
                    bytes / self.s / 1e9
                } else {
                    0.0
                };
                format!(" {n:>10.1} {:>9.3} {rate:>8.0}", bytes / 1e9)
            });
        }
        if cols.predicted {
            l += &self
                .predicted
                .map_or(blank(15), |p| format!(" {:>14.2}", 1e3 * p));
        }
        l.trim_end().to_string() + "\n"
    }
}
