//! `tern bench` output: llama-bench's markdown table, quoted CSV, streamed
//! JSON array, and its number formats.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::json;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Md,
    Csv,
    Json,
}

/// One `| a | b |` table column: header, width, left-aligned or not.
pub struct Col {
    pub name: String,
    pub width: usize,
    pub left: bool,
}

impl Col {
    pub fn new(name: &str, width: usize, left: bool) -> Col {
        Col { name: name.to_string(), width: width.max(name.chars().count()), left }
    }
}

fn pad(s: &str, c: &Col) -> String {
    let fill = " ".repeat(c.width.saturating_sub(s.chars().count()));
    if c.left {
        format!("{s}{fill}")
    } else {
        format!("{fill}{s}")
    }
}

/// A markdown table's header and separator lines, llama-bench style.
pub fn md_header(cols: &[Col]) -> String {
    let names: Vec<String> = cols.iter().map(|c| pad(&c.name, c)).collect();
    let seps: Vec<String> = cols
        .iter()
        .map(|c| if c.left { "-".repeat(c.width) } else { format!("{}:", "-".repeat(c.width - 1)) })
        .collect();
    format!("| {} |\n| {} |", names.join(" | "), seps.join(" | "))
}

pub fn md_row(cols: &[Col], cells: &[String]) -> String {
    let cells: Vec<String> = cols.iter().zip(cells).map(|(c, s)| pad(s, c)).collect();
    format!("| {} |", cells.join(" | "))
}

/// A CSV line with every field quoted, as llama-bench writes them.
pub fn csv_row(cells: &[String]) -> String {
    cells.iter().map(|c| format!("\"{}\"", c.replace('"', "\"\""))).collect::<Vec<_>>().join(",")
}

/// Prints one line of results and flushes, so long runs show progress.
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Streams a JSON array: `[`, the objects, `]`.
pub struct JsonArray {
    n: usize,
}

impl JsonArray {
    pub fn start() -> JsonArray {
        emit("[");
        JsonArray { n: 0 }
    }

    pub fn push(&mut self, fields: &[(&str, String)]) {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("    {}: {v}", json::string(k))).collect();
        let sep = if self.n == 0 { "" } else { ",\n" };
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{sep}  {{\n{}\n  }}", body.join(",\n"));
        let _ = out.flush();
        self.n += 1;
    }

    pub fn finish(self) {
        emit(if self.n == 0 { "]" } else { "\n]" });
    }
}

/// "790.52 MiB" / "2.41 GiB", as llama-bench prints sizes.
pub fn fmt_size(b: u64) -> String {
    let b = b as f64;
    if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", b / 1024.0 / 1024.0 / 1024.0)
    }
}

/// "2.41 B" / "617.47 M", as llama-bench prints parameter counts.
pub fn fmt_params(n: u64) -> String {
    let n = n as f64;
    if n < 1e9 {
        format!("{:.2} M", n / 1e6)
    } else {
        format!("{:.2} B", n / 1e9)
    }
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n.max(1.0);
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The current UTC time as `2025-04-24T11:57:09Z`.
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}
