//! The placement plan as `tern info --plan` shows it: every weight's backend
//! and reason, then how a one-token decode step is assigned and split.

use std::collections::BTreeMap;

use tern_graph::Op;
use tern_sched::Schedule;

use crate::json;
use crate::run::ModelArgs;
use crate::CliError;

pub struct Plan {
    weights: Vec<(String, String, String, u64)>, // name, backend, reason, bytes
    /// Per backend: weight bytes read per token.
    bytes_per_token: BTreeMap<String, u64>,
    /// Node assignment counts: (backend, reason) → nodes.
    nodes: BTreeMap<(String, String), usize>,
    splits: Vec<(String, usize, usize)>, // backend, nodes, copies
    copy_bytes: usize,
}

impl Plan {
    pub fn of(args: &ModelArgs) -> Result<Plan, CliError> {
        let mut small = args.clone();
        small.ctx_size = Some(small.ctx_or(256).min(256));
        let session = small.load()?;
        let entries = &session.model.weights.table.entries;
        let mut weights = Vec::new();
        let mut bytes_per_token = BTreeMap::new();
        for (info, place) in entries.iter().zip(&session.placement.weights) {
            weights.push((info.name.clone(), place.backend.to_string(), place.reason.to_string(), info.nbytes));
        }
        let (built, schedule): (_, Schedule) = session.plan(1, 1);
        let mut nodes = BTreeMap::new();
        for (node, a) in built.graph.nodes.iter().zip(&schedule.assigned) {
            if let Op::Weight(i) = node.op {
                // The embedding is read one row per token, every other weight whole.
                let bytes = if i == session.model.weights.token_embd.index && i != session.model.weights.output.index {
                    entries[i].nbytes / entries[i].ne[1].max(1)
                } else {
                    entries[i].nbytes
                };
                *bytes_per_token.entry(a.backend.to_string()).or_insert(0) += bytes;
            }
            if !node.op.is_leaf() {
                *nodes.entry((a.backend.to_string(), a.reason.to_string())).or_insert(0) += 1;
            }
        }
        let splits = schedule.splits.iter().map(|s| (s.backend.to_string(), s.nodes.len(), s.copies.len())).collect();
        Ok(Plan { weights, bytes_per_token, nodes, splits, copy_bytes: schedule.copy_bytes(&built.graph) })
    }

    pub fn print(&self) {
        println!("\nplacement (weights):");
        println!("  {:<36} {:<7} {:>12}  reason", "tensor", "backend", "bytes");
        for (name, backend, reason, bytes) in &self.weights {
            println!("  {name:<36} {backend:<7} {bytes:>12}  {reason}");
        }
        println!("\ndecode step (1 token):");
        for (backend, bytes) in &self.bytes_per_token {
            println!("  {backend:<7} reads {bytes} weight bytes per token");
        }
        for ((backend, reason), n) in &self.nodes {
            println!("  {backend:<7} {n:>5} nodes  ({reason})");
        }
        println!("  {} splits, {} bytes copied per token", self.splits.len(), self.copy_bytes);
        for (i, (backend, n, copies)) in self.splits.iter().enumerate() {
            println!("    split {i}: {backend:<7} {n:>4} nodes, {copies} inputs copied in");
        }
    }

    pub fn json(&self) -> String {
        let weights: Vec<String> = self
            .weights
            .iter()
            .map(|(n, b, r, bytes)| {
                json::object(&[
                    ("name", json::string(n)),
                    ("backend", json::string(b)),
                    ("reason", json::string(r)),
                    ("bytes", bytes.to_string()),
                ])
            })
            .collect();
        let per_token: Vec<String> = self
            .bytes_per_token
            .iter()
            .map(|(b, n)| json::object(&[("backend", json::string(b)), ("weight_bytes", n.to_string())]))
            .collect();
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|((b, r), n)| {
                json::object(&[("backend", json::string(b)), ("reason", json::string(r)), ("nodes", n.to_string())])
            })
            .collect();
        let splits: Vec<String> = self
            .splits
            .iter()
            .map(|(b, n, c)| {
                json::object(&[("backend", json::string(b)), ("nodes", n.to_string()), ("copies", c.to_string())])
            })
            .collect();
        json::object(&[
            ("weights", json::array(&weights)),
            ("per_token", json::array(&per_token)),
            ("nodes", json::array(&nodes)),
            ("splits", json::array(&splits)),
            ("copy_bytes_per_token", self.copy_bytes.to_string()),
        ])
    }
}
