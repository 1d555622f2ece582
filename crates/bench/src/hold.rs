//! The one rule that says whether a load step held, shared by every scenario.
//!
//! A step holds only if every condition of its rule holds, and each condition is reported on
//! its own (in the table and the JSON) with what was measured and what was required, so a
//! reader sees *why* a step did not hold. Scenarios build their rule from the same pieces:
//! client counts, error counts that must be zero, and bounds on rates and latencies.

use serde::Serialize;

/// One condition: what it requires, what was measured, and whether it held.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Condition {
    pub name: &'static str,
    pub held: bool,
    pub measured: String,
    pub required: String,
}

/// A step's conditions.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Hold {
    pub conditions: Vec<Condition>,
}

impl Hold {
    pub fn new() -> Hold {
        Hold::default()
    }

    fn push(mut self, name: &'static str, held: bool, measured: String, required: String) -> Hold {
        self.conditions.push(Condition { name, held, measured, required });
        self
    }

    /// A count that must be zero: errors, losses, gaps.
    pub fn none(self, name: &'static str, count: u64) -> Hold {
        self.push(name, count == 0, count.to_string(), "0".into())
    }

    /// `measured >= min`; `unit` follows the figures in the report.
    pub fn at_least(self, name: &'static str, measured: f64, min: f64, unit: &str) -> Hold {
        self.push(name, measured >= min, fmt(measured, unit), format!(">= {}", fmt(min, unit)))
    }

    /// `measured <= max`.
    pub fn at_most(self, name: &'static str, measured: f64, max: f64, unit: &str) -> Hold {
        self.push(name, measured <= max, fmt(measured, unit), format!("<= {}", fmt(max, unit)))
    }

    /// Every condition held (and there is at least one).
    pub fn held(&self) -> bool {
        !self.conditions.is_empty() && self.conditions.iter().all(|c| c.held)
    }

    /// The conditions that did not hold, as `name measured (required)`, or `-` if none.
    pub fn failures(&self) -> String {
        let failed: Vec<String> = self
            .conditions
            .iter()
            .filter(|c| !c.held)
            .map(|c| format!("{} {} ({})", c.name, c.measured, c.required))
            .collect();
        if failed.is_empty() { "-".into() } else { failed.join("; ") }
    }
}

fn fmt(v: f64, unit: &str) -> String {
    let number = if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.0}") } else { format!("{v:.2}") };
    if unit.is_empty() { number } else { format!("{number} {unit}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_holds_only_if_every_condition_does() {
        let ok =
            Hold::new().none("errors", 0).at_least("rate", 50.0, 47.5, "Hz").at_most("p99", 3.2, 20.0, "ms");
        assert!(ok.held());
        assert_eq!(ok.failures(), "-");
        let bad = ok.clone().none("version gaps", 2).at_least("clients", 999.0, 1000.0, "");
        assert!(!bad.held());
        assert_eq!(bad.failures(), "version gaps 2 (0); clients 999 (>= 1000)");
        assert!(!Hold::new().held(), "an empty rule proves nothing");
    }
}
