//! `--profile`: where evaluation time went, as shares of the steps' wall
//! time: building graphs, writing inputs, copies between backends, each
//! backend's compute (by op, and the slowest matmuls by weight), and waiting
//! for results. Printed to stderr.

use tern_engine::Profile;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub fn print(p: &Profile) {
    let total = p.total_ns.max(1);
    let share = |ns: u64| 100.0 * ns as f64 / total as f64;
    let row = |what: &str, ns: u64, extra: String| {
        eprintln!("  {what:<24} {:>10.3} ms {:>6.1}%  {extra}", ms(ns), share(ns));
    };
    eprintln!("\nprofile: {} evaluation steps, {:.3} ms in all", p.evals, ms(p.total_ns));
    let r = &p.run;
    row("graph build + schedule", p.graph_ns, String::new());
    row("inputs", r.input_ns, String::new());
    // Copies a device did inside its compute count as copies, not compute.
    let io_ns =
        |b: &tern_backend::BackendId| p.backends.iter().filter(|(id, _)| id == b).map(|(_, o)| o.io_ns).sum::<u64>();
    let inside: u64 = p.backends.iter().map(|(_, o)| o.io_ns).sum();
    row(
        "copies",
        r.copy_ns() + inside,
        format!(
            "{} bytes; {:.3} ms of it inside device compute (copies, and ops reading host memory)",
            r.copy_bytes(),
            ms(inside)
        ),
    );
    for ((from, to), c) in &r.copies {
        let calls = c.count - c.in_compute;
        let inside = match c.in_compute {
            0 => String::new(),
            n => format!(" ({n} done inside device compute)"),
        };
        let each = match calls {
            0 => String::new(),
            n => format!(", {:.1} µs per copy call", c.ns as f64 / 1e3 / n as f64),
        };
        row(&format!("  {from} -> {to}"), c.ns, format!("{} bytes, {} copies{inside}{each}", c.bytes, c.count));
    }
    row("sync", r.sync_ns, "host waiting for devices before its splits".into());
    for (b, ns) in &r.compute_ns {
        row(&format!("{b} compute"), ns.saturating_sub(io_ns(b)), String::new());
    }
    row("sync + readback", r.readback_ns, "waiting for the last device and reading logits".into());
    let known = p.graph_ns + r.input_ns + r.copy_ns() + r.sync_ns + r.compute_ns.values().sum::<u64>() + r.readback_ns;
    row("other (host)", total.saturating_sub(known), String::new());
    for (b, ops) in &p.backends {
        if ops.by_op.is_empty() {
            continue;
        }
        let op_total = ops.total_ns().max(1);
        eprintln!("  {b} by op ({:.3} ms recorded):", ms(op_total));
        let mut by_op: Vec<_> = ops.by_op.iter().collect();
        by_op.sort_by_key(|(_, (ns, _))| std::cmp::Reverse(*ns));
        for (name, (ns, count)) in by_op {
            eprintln!(
                "    {name:<22} {:>10.3} ms {:>6.1}% {:>8} calls {:>9.1} µs each",
                ms(*ns),
                100.0 * *ns as f64 / op_total as f64,
                count,
                *ns as f64 / 1e3 / (*count).max(1) as f64
            );
        }
        let mut mats: Vec<_> = ops.by_label.iter().collect();
        mats.sort_by_key(|(_, (ns, _))| std::cmp::Reverse(*ns));
        if !mats.is_empty() {
            eprintln!("    slowest matmuls:");
            for (name, (ns, count)) in mats.into_iter().take(8) {
                eprintln!("      {name:<30} {:>9.3} ms {:>8} calls", ms(*ns), count);
            }
        }
    }
}
