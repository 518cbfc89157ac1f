//! `tern bench` end to end on the compact ternary model: the llama-bench
//! table, csv and json, the -pg and --sweep rows, --mem-bw, and clean errors.
//! Tiny sizes and no timing assertions: only shapes and parseable numbers.

use std::process::{Command, Output};

fn model() -> String {
    tern_testutil::compact_model("b158-e512-tq2_0.gguf").display().to_string()
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tern")).arg("bench").args(args).output().expect("run tern")
}

/// `bench -m MODEL -t 1 ARGS...`, which must succeed; its stdout.
fn ok(args: &[&str]) -> String {
    let m = model();
    let mut all = vec!["-m", m.as_str(), "-t", "1"];
    all.extend_from_slice(args);
    let out = bench(&all);
    assert!(out.status.success(), "tern bench {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The cells of each `| a | b |` line.
fn md_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

/// The data row whose column `col` is `key`.
fn row<'a>(rows: &'a [Vec<String>], col: usize, key: &str) -> &'a [String] {
    rows.iter().find(|r| r.get(col).is_some_and(|c| c == key)).unwrap_or_else(|| panic!("no row {key}: {rows:?}"))
}

/// "123.45 ± 1.23" → 123.45.
fn mean_of(cell: &str) -> f64 {
    let (mean, sd) = cell.split_once(" ± ").unwrap_or_else(|| panic!("not mean ± sd: {cell:?}"));
    sd.parse::<f64>().unwrap();
    mean.parse().unwrap()
}

#[test]
fn markdown_table_like_llama_bench() {
    let out = ok(&["-p", "16", "-n", "4", "-r", "2"]);
    let rows = md_rows(&out);
    assert_eq!(rows[0], ["model", "size", "params", "backend", "threads", "test", "t/s"], "{out}");
    assert!(rows[1].iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':')), "{out}");
    assert_eq!(rows.len(), 4, "{out}");
    for test in ["pp16", "tg4"] {
        let r = row(&rows, 5, test);
        assert!(r[0].starts_with("bitnet-b1.58 ") && r[0].ends_with(" TQ2_0"), "{r:?}");
        assert!(r[1].ends_with(" MiB") && r[2].ends_with(" M"), "{r:?}");
        assert_eq!((r[3].as_str(), r[4].as_str()), ("CPU", "1"));
        assert!(mean_of(&r[6]) > 0.0, "{r:?}");
    }
}

#[test]
fn combined_test_and_extra_columns() {
    // -pg and -ub are single-dash long options; a non-default -ub gets a column.
    let out = ok(&["-p", "0", "-n", "0", "-pg", "8,4", "-ub", "4", "-r", "1", "--no-warmup"]);
    let rows = md_rows(&out);
    assert_eq!(rows[0], ["model", "size", "params", "backend", "threads", "n_ubatch", "test", "t/s"], "{out}");
    let r = row(&rows, 6, "pp8+tg4");
    assert_eq!(r[5], "4");
    assert!(mean_of(&r[7]) > 0.0);
}

#[test]
fn csv_and_json() {
    let csv = ok(&["-p", "16", "-n", "4", "-r", "2", "-o", "csv", "-ctk", "f32", "-ctv", "q8_0"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for field in ["model_filename", "model_type", "n_threads", "n_prompt", "n_gen", "avg_ts", "stddev_ts"] {
        assert!(header.contains(&field), "{field} missing: {csv}");
    }
    let at = |line: &str, field: &str| -> String {
        let cells: Vec<&str> = line.split("\",\"").collect();
        assert_eq!(cells.len(), header.len(), "{line}");
        cells[header.iter().position(|h| *h == field).unwrap()].trim_matches('"').to_string()
    };
    assert_eq!((at(lines[1], "n_prompt"), at(lines[1], "n_gen")), ("16".into(), "0".into()));
    assert_eq!((at(lines[2], "n_prompt"), at(lines[2], "n_gen")), ("0".into(), "4".into()));
    assert_eq!((at(lines[1], "type_k"), at(lines[1], "type_v")), ("f32".into(), "q8_0".into()));
    assert!(at(lines[2], "avg_ts").parse::<f64>().unwrap() > 0.0);

    let json = ok(&["-p", "16", "-n", "4", "-r", "2", "-o", "json"]);
    let json = json.trim();
    assert!(json.starts_with('[') && json.ends_with(']'), "{json}");
    assert_eq!(json.matches("\"avg_ts\": ").count(), 2, "{json}");
    for field in ["samples_ns", "samples_ts", "model_n_params", "test_time", "stddev_ns"] {
        assert!(json.contains(&format!("\"{field}\": ")), "{field} missing: {json}");
    }
    let samples = json.split("\"samples_ns\": [").nth(1).unwrap().split(']').next().unwrap();
    let samples: Vec<u64> = samples.split(',').map(|s| s.trim().parse().unwrap()).collect();
    assert!(samples.len() == 2 && samples.iter().all(|&ns| ns > 0), "{samples:?}");
}

#[test]
fn sweep_fills_the_context_step_by_step() {
    let out = ok(&["--sweep", "-c", "64", "-ub", "16", "-n", "4"]);
    let rows = md_rows(&out);
    assert_eq!(rows[0], ["PP", "TG", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s"], "{out}");
    let depths: Vec<&str> = rows[2..].iter().map(|r| r[2].as_str()).collect();
    assert_eq!(depths, ["0", "16", "32", "48"], "{out}");
    for r in &rows[2..] {
        assert_eq!((r[0].as_str(), r[1].as_str()), ("16", "4"));
        // Times print with 3 decimals and can round to 0 on a fast machine; rates cannot.
        assert!(r[3..].iter().all(|c| c.parse::<f64>().unwrap() >= 0.0), "{r:?}");
        assert!([&r[4], &r[6]].iter().all(|c| c.parse::<f64>().unwrap() > 0.0), "{r:?}");
    }
}

#[test]
fn memory_bandwidth() {
    let out = bench(&["--mem-bw", "-t", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = String::from_utf8(out.stdout).unwrap();
    let rows = md_rows(&out);
    let gbs = rows[0].iter().position(|c| c == "GB/s").unwrap_or_else(|| panic!("{out}"));
    assert_eq!(rows.len(), 3, "one row, for 1 thread: {out}");
    assert_eq!(rows[2][0], "1");
    assert!(rows[2][gbs].parse::<f64>().unwrap() > 0.0, "{out}");
}

#[test]
fn bad_values_give_one_error_line() {
    let m = model();
    for args in [
        vec!["-o", "xml"],
        vec!["-p", "16,x"],
        vec!["-r", "0"],
        vec!["-t", "0"],
        vec!["-pg", "8"],
        vec!["-ctk", "q4_0"],
        vec!["--sweep", "-c", "8", "-ub", "16"],
    ] {
        let mut all = vec!["-m", m.as_str()];
        all.extend(args.iter().copied());
        let out = bench(&all);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(lines[0].starts_with("error: "), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
