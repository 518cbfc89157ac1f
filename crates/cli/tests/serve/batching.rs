//! Continuous batching: greedy streams decoded together against each alone
//! and `tern run`, prompt reuse between requests (`cache_prompt`), a client
//! that leaves while others stream, `-b` below `-np`, and the soak.
//!
//! Batched arithmetic may differ from one sequence's in the last bits (a
//! prompt cut into other chunks takes other attention kernels), so greedy
//! texts are compared as token lists: identical, or a first difference
//! where the reference's two most likely tokens were within 1e-3 of each
//! other (their log-probability gap, which is their logits' gap, read from
//! the reference's `logprobs`).

use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{long_stream, tern, Serve};

/// A greedy completion: its text, token pieces, prompt counts, and per token
/// the gap between the two best tokens' log-probabilities.
struct Greedy {
    text: String,
    tokens: Vec<String>,
    gaps: Vec<f64>,
    prompt_tokens: u64,
    cached_tokens: u64,
}

fn greedy(s: &Serve, prompt: &str, n: usize, cache_prompt: bool) -> Greedy {
    let body =
        json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 2, "cache_prompt": cache_prompt});
    let v = s.ok("/v1/completions", &body);
    let lp = &v["choices"][0]["logprobs"];
    let strings =
        |v: &Value| -> Vec<String> { v.as_array().unwrap().iter().map(|t| t.as_str().unwrap().into()).collect() };
    let gaps = lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|top| {
            let mut lps: Vec<f64> = top.as_object().unwrap().values().map(|x| x.as_f64().unwrap()).collect();
            lps.sort_by(|a, b| b.total_cmp(a));
            // Two alternatives of one piece share a key: no gap is known, none is granted.
            if lps.len() < 2 {
                f64::INFINITY
            } else {
                lps[0] - lps[1]
            }
        })
        .collect();
    Greedy {
        text: v["choices"][0]["text"].as_str().unwrap().into(),
        tokens: strings(&lp["tokens"]),
        gaps,
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap(),
        cached_tokens: v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    }
}

/// `got` continues as `want` does up to rounding (the module's rule).
fn agrees(want: &Greedy, got: &Greedy) -> Result<(), String> {
    let first = want.tokens.iter().zip(&got.tokens).position(|(a, b)| a != b);
    match first {
        None if want.tokens.len() == got.tokens.len() => Ok(()),
        // One stopped (at an end token) where the other went on: no gap is known there.
        None => Err(format!("{} tokens against {}", got.tokens.len(), want.tokens.len())),
        Some(i) if want.gaps[i] <= 1e-3 => Ok(()),
        Some(i) => Err(format!(
            "token {i}: {:?} against {:?}, where the best two were {:.2e} apart\n got: {:?}\nwant: {:?}",
            got.tokens[i], want.tokens[i], want.gaps[i], got.text, want.text
        )),
    }
}

const PROMPTS: [&str; 16] = [
    "And God said",
    "In the beginning",
    "And the LORD spake unto Moses, saying,",
    "Blessed are the meek:",
    "The LORD is my shepherd;",
    "And it came to pass in those days,",
    "Thou shalt love thy neighbour",
    "And Jesus answered and said unto them,",
    "For God so loved the world,",
    "Now the serpent was more subtil",
    "And the children of Israel",
    "Hear, O Israel:",
    "Let there be light",
    "And David said",
    "Vanity of vanities,",
    "The words of the Preacher,",
];

/// Each prompt's greedy text alone, then all sixteen at once in sixteen
/// slots: every stream agrees with its text alone, and the first alone is
/// `tern run`'s. The steps held more than half of the streams on average,
/// so they were decoded together.
#[test]
fn greedy_streams_decoded_together_match_each_alone() {
    let n = 48;
    let out = tern(&["run", "--temp", "0", "-p", PROMPTS[0], "-n", &n.to_string(), "-t", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let run_text = stdout.strip_prefix(PROMPTS[0]).unwrap().strip_suffix('\n').unwrap().to_string();

    let s = Arc::new(Serve::start(&["-np", "16", "-c", "8192"]));
    let alone: Vec<Greedy> = PROMPTS.iter().map(|p| greedy(&s, p, n, false)).collect();
    assert_eq!(alone[0].text, run_text, "alone against tern run");
    let (steps, seqs) = (s.metric("tern_steps_total"), s.metric("tern_step_sequences_total"));
    let start = Arc::new(Barrier::new(PROMPTS.len()));
    let together: Vec<Greedy> = std::thread::scope(|sc| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let (s, start) = (s.clone(), start.clone());
                sc.spawn(move || {
                    start.wait();
                    greedy(&s, p, n, false)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (want, got)) in alone.iter().zip(&together).enumerate() {
        agrees(want, got).unwrap_or_else(|e| panic!("prompt {i} ({:?}) among 15 others: {e}", PROMPTS[i]));
    }
    let per_step = (s.metric("tern_step_sequences_total") - seqs) / (s.metric("tern_steps_total") - steps);
    assert!(per_step > 8.0, "{per_step:.1} sequences a step: the streams were not decoded together");
}

/// A request that shares a prefix with an earlier one evaluates only the
/// rest (its usage and the counters say how much was reused), and its
/// greedy text agrees with the same request evaluated whole.
#[test]
fn a_shared_prefix_is_evaluated_once() {
    let s = Serve::start(&["-np", "2"]);
    let base = "And God said, Let there be light: and there was light. And God saw the light, that it was good: \
                and God divided the light from the darkness.";
    let follow = format!("{base} And God called the light Day, and the darkness he called Night.");
    let counts = || (s.metric("tern_prompt_tokens_evaluated_total"), s.metric("tern_prompt_tokens_cached_total"));

    let first = greedy(&s, base, 16, true);
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(counts(), (first.prompt_tokens as f64, 0.0));

    let (evaluated, cached) = counts();
    let reused = greedy(&s, &follow, 24, true);
    let k = reused.cached_tokens;
    assert!(k + 1 >= first.prompt_tokens && k < reused.prompt_tokens, "{k} of {} cached", reused.prompt_tokens);
    assert_eq!(counts(), (evaluated + (reused.prompt_tokens - k) as f64, cached + k as f64));

    let (evaluated, cached) = counts();
    let whole = greedy(&s, &follow, 24, false);
    assert_eq!(whole.cached_tokens, 0);
    assert_eq!(counts(), (evaluated + whole.prompt_tokens as f64, cached));
    agrees(&whole, &reused).unwrap_or_else(|e| panic!("reused prefix against the whole prompt: {e}"));
}

/// A client that disconnects mid-stream while three others stream: its
/// slot is free within the bounded wait, the others run to their end.
#[test]
fn a_client_leaving_among_others_frees_its_slot() {
    let s = Serve::start(&["-np", "4"]);
    let others: Vec<_> = (0..3).map(|_| long_stream(&s)).collect();
    let mut leaving = long_stream(&s);
    let mut buf = [0u8; 256];
    leaving.read_exact(&mut buf).unwrap();
    assert_eq!(s.metric("tern_slots_busy"), 4.0);
    drop(leaving);
    let t0 = Instant::now();
    while s.metric("tern_slots_busy") != 3.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the slot stayed busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    for mut r in others {
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert!(rest.trim_end().ends_with("data: [DONE]"), "a stream beside it was cut: {rest}");
    }
    assert_eq!(s.metric("tern_slots_busy"), 0.0);
    assert_eq!(s.metric("tern_requests_failed_total"), 0.0);
}

#[test]
fn a_step_smaller_than_the_slots_is_refused() {
    let out = tern(&["serve", "--port", "0", "-np", "4", "-b", "2"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("-b 2 is less than -np 4"), "{err}");
}

/// The server's resident memory (`VmRSS`) in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One soak request, varied by `i`: chat or completion, streamed or whole,
/// 1 to 64 tokens, with or without prompt reuse, one in eight abandoned
/// after its first chunk. Err on anything but a whole, well-formed answer.
fn soak_request(s: &Serve, agent: &ureq::Agent, i: u64) -> Result<(), String> {
    let prompt = format!("{} {}", PROMPTS[(i % 16) as usize], PROMPTS[(i / 16 % 16) as usize]);
    let (stream, chat) = (!i.is_multiple_of(3), i.is_multiple_of(5));
    let temperature = if i.is_multiple_of(2) { 0.0 } else { 0.8 };
    let mut body = json!({"max_tokens": 1 + i % 64, "temperature": temperature, "stream": stream,
        "cache_prompt": !i.is_multiple_of(7)});
    let path = if chat {
        body["messages"] = json!([{"role": "user", "content": prompt}]);
        "/v1/chat/completions"
    } else {
        body["prompt"] = json!(prompt);
        "/v1/completions"
    };
    let resp = agent.post(&s.url(path)).send_string(&body.to_string()).map_err(|e| format!("{path}: {e}"))?;
    if !stream {
        let text = resp.into_string().map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}: {text}"))?;
        return match v["choices"][0]["finish_reason"].as_str() {
            Some("stop" | "length") => Ok(()),
            _ => Err(format!("{path}: {v}")),
        };
    }
    let mut lines = std::io::BufReader::new(resp.into_reader()).lines();
    if i % 8 == 1 {
        lines.next();
        return Ok(()); // dropped: the client leaves mid-stream
    }
    let last = lines.map_while(Result::ok).filter(|l| l.starts_with("data: ")).last();
    match last.as_deref() {
        Some("data: [DONE]") => Ok(()),
        other => Err(format!("{path}: stream ended with {other:?}")),
    }
}

/// 64 clients for two minutes against 16 slots: no request fails, every
/// slot is free at the end, and resident memory at the end is within 5% of
/// what it was after 10 s.
#[test]
#[ignore = "a two-minute soak; run it with `cargo test --release -p tern-cli --test serve -- --ignored soak`"]
fn soak_64_clients_for_two_minutes() {
    let s = Arc::new(Serve::start(&["-np", "16", "-c", "8192", "--max-queue", "64"]));
    let pid = s.child.id();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(120);
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let rss_10s = std::thread::scope(|sc| {
        for c in 0..64u64 {
            let (s, done, failed) = (s.clone(), done.clone(), failed.clone());
            sc.spawn(move || {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
                let mut i = c;
                while Instant::now() < end {
                    match soak_request(&s, &agent, i) {
                        Ok(()) => done.fetch_add(1, Relaxed),
                        Err(e) => {
                            eprintln!("client {c}: {e}");
                            failed.fetch_add(1, Relaxed)
                        }
                    };
                    i += 64;
                }
            });
        }
        std::thread::sleep(Duration::from_secs(10));
        rss_kib(pid)
    });
    let t1 = Instant::now();
    while s.metric("tern_slots_busy") != 0.0 {
        assert!(t1.elapsed() < Duration::from_secs(10), "slots stayed busy after the clients stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    let rss_end = rss_kib(pid);
    let (done, failed) = (done.load(Relaxed), failed.load(Relaxed));
    eprintln!(
        "soak: {done} requests in {:.0} s, {failed} failed; {} tokens generated; VmRSS {rss_10s} KiB at 10 s, \
         {rss_end} KiB at the end",
        t0.elapsed().as_secs_f64(),
        s.metric("tern_generated_tokens_total"),
    );
    assert_eq!(failed, 0);
    assert_eq!(s.metric("tern_requests_failed_total"), 0.0);
    assert!(rss_end as f64 <= rss_10s as f64 * 1.05, "VmRSS grew from {rss_10s} KiB to {rss_end} KiB");
}
