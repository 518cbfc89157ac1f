//! Weight placement: which backend every weight tensor lives on, and why.
//! This is plain data, printable by `tern info --plan` and asserted by tests.

use std::fmt;

use regex::Regex;
use tern_backend::BackendId;

/// Why a weight lives where it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightReason {
    /// No rule matched: weights stay on the host.
    Default,
    /// A `-ot PATTERN=BACKEND` rule matched (the first matching rule wins).
    Override { pattern: String },
}

impl fmt::Display for WeightReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightReason::Default => f.write_str("default"),
            WeightReason::Override { pattern } => write!(f, "override {pattern:?}"),
        }
    }
}

/// One `-ot` rule: an unanchored regex search on the tensor name.
#[derive(Clone, Debug)]
pub struct Override {
    pub pattern: Regex,
    pub backend: BackendId,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("override {spec:?} is not of the form REGEX=BACKEND")]
    Syntax { spec: String },
    #[error("override {spec:?}: bad regex: {reason}")]
    Regex { spec: String, reason: String },
    #[error("override {spec:?}: unknown backend {name:?}; valid backends: {valid}")]
    UnknownBackend { spec: String, name: String, valid: String },
}

/// The user's placement rules.
#[derive(Clone, Debug, Default)]
pub struct PlacementRules {
    pub overrides: Vec<Override>,
}

impl PlacementRules {
    /// Parses `-ot` values. Each value may hold a comma list of `REGEX=BACKEND`
    /// (split at the first `=`); `available` names the backends that exist.
    pub fn parse_overrides(values: &[String], available: &[BackendId]) -> Result<PlacementRules, RuleError> {
        let mut overrides = Vec::new();
        for value in values {
            for spec in value.split(',').filter(|s| !s.is_empty()) {
                let (pat, name) = spec.split_once('=').ok_or_else(|| RuleError::Syntax { spec: spec.to_string() })?;
                let pattern = Regex::new(pat)
                    .map_err(|e| RuleError::Regex { spec: spec.to_string(), reason: regex_reason(&e) })?;
                let valid = || available.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ");
                let backend = name.parse::<BackendId>().ok().filter(|b| available.contains(b)).ok_or_else(|| {
                    RuleError::UnknownBackend { spec: spec.to_string(), name: name.to_string(), valid: valid() }
                })?;
                overrides.push(Override { pattern, backend });
            }
        }
        Ok(PlacementRules { overrides })
    }
}

/// The regex crate's message draws a caret under the pattern over several
/// lines; its last line is the reason.
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    let last = text.lines().last().unwrap_or_default().trim();
    last.strip_prefix("error: ").unwrap_or(last).to_string()
}

/// Where one weight lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlace {
    pub name: String,
    pub backend: BackendId,
    pub reason: WeightReason,
}

/// The placement of every weight, plus the home of each layer's KV cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Indexed like the model's weight table.
    pub weights: Vec<WeightPlace>,
    /// Backend holding each layer's KV cache.
    pub kv_homes: Vec<BackendId>,
}

impl Placement {
    /// Places weights by name under `rules`; `n_layer` caches stay on the host.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>, n_layer: usize, rules: &PlacementRules) -> Placement {
        let weights = names
            .into_iter()
            .map(|name| {
                let hit = rules.overrides.iter().find(|o| o.pattern.is_match(name));
                let (backend, reason) = match hit {
                    Some(o) => (o.backend, WeightReason::Override { pattern: o.pattern.as_str().to_string() }),
                    None => (BackendId::CPU, WeightReason::Default),
                };
                WeightPlace { name: name.to_string(), backend, reason }
            })
            .collect();
        Placement { weights, kv_homes: vec![BackendId::CPU; n_layer] }
    }

    /// All backends that hold something.
    pub fn backends(&self) -> Vec<BackendId> {
        let mut b: Vec<BackendId> =
            self.weights.iter().map(|w| w.backend).chain(self.kv_homes.iter().copied()).collect();
        b.push(BackendId::CPU);
        b.sort();
        b.dedup();
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(specs: &[&str]) -> Result<PlacementRules, RuleError> {
        let v: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        PlacementRules::parse_overrides(&v, &[BackendId::CPU, BackendId::cpu(1)])
    }

    #[test]
    fn first_matching_override_wins() {
        let r = rules(&["ffn_up=CPU1,blk\\.1\\.=CPU", "ffn=CPU1"]).unwrap();
        let p = Placement::new(
            ["blk.0.ffn_up.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight", "output_norm.weight"],
            2,
            &r,
        );
        let got: Vec<String> = p.weights.iter().map(|w| w.backend.to_string()).collect();
        assert_eq!(got, ["CPU1", "CPU1", "CPU", "CPU"]);
        assert_eq!(p.weights[2].reason, WeightReason::Override { pattern: "blk\\.1\\.".into() });
        assert_eq!(p.weights[3].reason, WeightReason::Default);
    }

    #[test]
    fn bad_rules_are_clear_errors() {
        assert!(matches!(rules(&["ffn("]), Err(RuleError::Syntax { .. })));
        assert!(matches!(rules(&["ffn(=CPU"]), Err(RuleError::Regex { .. })));
        match rules(&["ffn=CUDA0"]) {
            Err(RuleError::UnknownBackend { valid, .. }) => assert_eq!(valid, "CPU, CPU1"),
            other => panic!("{other:?}"),
        }
    }
}
