//! The API: every endpoint and every error class, greedy output against
//! `tern run --temp 0`, streams against whole answers, a client that
//! disconnects, and SIGTERM.

use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use tern_gguf::Value as GgufValue;

use crate::harness::{demo, demo_variant, error_message, long_stream, tern, Serve};

#[test]
fn every_plain_endpoint_answers() {
    let s = Serve::start(&["--alias", "kjv"]);
    assert_eq!(s.call("GET", "/health", None, &[]), (200, r#"{"status":"ok"}"#.to_string()));
    let (_, models) = s.call("GET", "/v1/models", None, &[]);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "kjv");
    assert_eq!(models["data"][0]["meta"]["n_ctx_slot"], 512);

    let toks = s.ok("/tokenize", &json!({"content": "And God said"}));
    let ids: Vec<u64> = toks["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert!(!ids.is_empty());
    let text = s.ok("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(text["content"], "And God said");
    let with = s.ok("/tokenize", &json!({"content": "And God", "add_special": true, "with_pieces": true}));
    assert_eq!(with["tokens"].as_array().unwrap().len(), 3, "BOS, And, God: {with}");
    assert_eq!(with["tokens"][1]["piece"], "And");

    s.ok("/v1/completions", &json!({"prompt": "And", "max_tokens": 3}));
    let (status, text) = s.call("GET", "/metrics", None, &[]);
    assert_eq!(status, 200);
    for name in [
        "tern_requests_total 1",
        "tern_prompt_tokens_total 2",
        "tern_prompt_tokens_evaluated_total 2",
        "tern_prompt_tokens_cached_total 0",
        "tern_steps_total 3",
        "tern_step_sequences_total 3",
        "tern_generated_tokens_total 3",
        "tern_slots_total 1",
        "tern_slots_busy 0",
        "tern_queue_depth 0",
        "tern_time_to_first_token_seconds_count 1",
        "tern_inter_token_latency_seconds_count 2",
    ] {
        assert!(text.lines().any(|l| l == name), "{name} missing from {text}");
    }
}

#[test]
fn greedy_output_is_what_tern_run_generates() {
    let prompt = "And God said";
    let out = tern(&["run", "--temp", "0", "-p", prompt, "-n", "40", "-t", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let want = stdout.strip_prefix(prompt).unwrap().strip_suffix('\n').unwrap();

    let s = Serve::start(&["-np", "2", "-c", "1024"]);
    // Alone, and while another stream holds the other slot.
    let v = s.ok("/v1/completions", &json!({"prompt": prompt, "max_tokens": 40, "temperature": 0}));
    assert_eq!(v["choices"][0]["text"], want);
    let mut other = long_stream(&s);
    let beside = s.ok("/v1/completions", &json!({"prompt": prompt, "max_tokens": 40, "temperature": 0}));
    assert_eq!(beside["choices"][0]["text"], want);
    let mut rest = String::new();
    other.read_to_string(&mut rest).unwrap();
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert_eq!(v["object"], "text_completion");
    // The same prompt as token ids gives the same text.
    let ids = s.ok("/tokenize", &json!({"content": prompt, "add_special": true}))["tokens"].clone();
    let v2 = s.ok("/v1/completions", &json!({"prompt": ids, "max_tokens": 40, "temperature": 0}));
    assert_eq!(v2["choices"][0]["text"], want);
    assert_eq!(v2["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"]);
}

#[test]
fn streams_concatenate_to_the_whole_answer() {
    let s = Serve::start(&[]);
    let msgs = json!([{"role": "system", "content": "Answer."}, {"role": "user", "content": "Who made the earth?"}]);
    let body = json!({"messages": msgs, "max_tokens": 30, "temperature": 0});
    let whole = s.ok("/v1/chat/completions", &body);
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_string();

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/chat/completions", &sb);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(streamed, text);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    // The same counts; the stream's prompt was in the slot's cache but for its last token.
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage["usage"][k], whole["usage"][k], "{k}");
    }
    assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = whole["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);
    let finish = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(finish["finish_reason"], whole["choices"][0]["finish_reason"]);

    // Completions stream too, with no usage chunk unless asked.
    let cb = json!({"prompt": "In the beginning", "max_tokens": 25, "temperature": 0});
    let whole = s.ok("/v1/completions", &cb);
    let mut sb = cb.clone();
    sb["stream"] = json!(true);
    let events = s.stream("/v1/completions", &sb);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, whole["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn sampling_options_stop_strings_and_logprobs() {
    let s = Serve::start(&[]);
    let base = json!({"prompt": "And God said", "max_tokens": 40, "temperature": 0});
    let greedy = s.ok("/v1/completions", &base)["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string cuts the text before it, finish_reason stop.
    let word = "shalt";
    assert!(greedy.contains(word), "{greedy}");
    let mut b = base.clone();
    b["stop"] = json!(["zzz", word]);
    let v = s.ok("/v1/completions", &b);
    assert_eq!(v["choices"][0]["text"], greedy[..greedy.find(word).unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    b["stream"] = json!(true);
    let events = s.stream("/v1/completions", &b);
    let streamed: String = events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, v["choices"][0]["text"].as_str().unwrap(), "the stream never shows the stop string");

    // A seed makes sampling reproducible; penalties and filters are accepted.
    let sampled = json!({"prompt": "And God said", "max_tokens": 30, "temperature": 1.0, "top_k": 20, "top_p": 0.9,
        "min_p": 0.01, "seed": 7, "presence_penalty": 0.5, "frequency_penalty": 0.5});
    let a = s.ok("/v1/completions", &sampled);
    assert_eq!(a["choices"][0]["text"], s.ok("/v1/completions", &sampled)["choices"][0]["text"]);
    // A strong frequency penalty changes greedy output (the greedy text repeats itself).
    let mut pen = base.clone();
    pen["frequency_penalty"] = json!(2.0);
    assert_ne!(s.ok("/v1/completions", &pen)["choices"][0]["text"], greedy.as_str());

    // Chat log-probabilities: one entry per token, the chosen one first among greedy's alternatives.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0,
        "logprobs": true, "top_logprobs": 3});
    let v = s.ok("/v1/chat/completions", &chat);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    let joined: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(joined, v["choices"][0]["message"]["content"].as_str().unwrap());
    // Completions' legacy form.
    let v = s.ok("/v1/completions", &json!({"prompt": "And", "max_tokens": 4, "temperature": 0, "logprobs": 2}));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
}

#[test]
fn bad_requests_are_openai_errors_and_the_server_stays_up() {
    let s = Serve::start(&["-c", "64", "--max-body", "4096"]);
    let cases: [(&str, &str, u16, &str); 7] = [
        ("/v1/chat/completions", "{not json", 400, "invalid request body"),
        ("/v1/chat/completions", r#"{"messages": "hi"}"#, 400, "invalid request body"),
        ("/v1/completions", r#"{"prompt": "x", "max_tokens": "many"}"#, 400, "invalid request body"),
        ("/v1/completions", r#"{"prompt": "x", "temperature": -1}"#, 400, "temperature"),
        ("/v1/completions", r#"{"prompt": "x", "n": 2}"#, 400, "n = 1"),
        ("/v1/completions", r#"{"prompt": [1, 99999]}"#, 400, "outside the vocabulary"),
        ("/v1/chat/completions", r#"{"messages": []}"#, 400, "empty"),
    ];
    for (path, body, status, needle) in cases {
        let (got, text) = s.call("POST", path, Some(body), &[]);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(got, status, "{body}: {text}");
        assert!(error_message(&v).contains(needle), "{body}: {text}");
    }
    // Too large a body: 413.
    let big = json!({"prompt": "a ".repeat(3000)}).to_string();
    let (got, text) = s.call("POST", "/v1/completions", Some(&big), &[]);
    assert_eq!(got, 413, "{text}");
    error_message(&serde_json::from_str(&text).unwrap());
    // A prompt longer than the slot's context (64): 400 that says so.
    let long: Vec<u32> = (0..100).map(|i| 10 + i % 50).collect();
    let (got, v) = s.post("/v1/completions", &json!({ "prompt": long }));
    assert_eq!(got, 400);
    assert!(error_message(&v).contains("context of 64 tokens"), "{v}");
    // max_tokens past the context: stops there with finish_reason length
    // (as `tern run`, the last token is sampled from the full context, not evaluated).
    let v = s.ok("/v1/completions", &json!({"prompt": "And", "max_tokens": 1000, "temperature": 0}));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"], 64 + 1);
    // Unknown fields are ignored, null means not given; unknown paths are 404 objects.
    s.ok("/v1/completions", &json!({"prompt": "And", "max_tokens": 2, "frobnicate": {"x": 1}}));
    let nulls = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 2,
        "stream": null, "stream_options": null, "logprobs": null, "seed": -5, "stop": null, "temperature": null});
    s.ok("/v1/chat/completions", &nulls);
    let (got, text) = s.call("GET", "/v1/nothing", None, &[]);
    assert_eq!(got, 404);
    error_message(&serde_json::from_str(&text).unwrap());
    assert_eq!(s.call("GET", "/health", None, &[]).0, 200);
}

#[test]
fn the_api_key_is_required_when_set() {
    let s = Serve::start(&["--api-key", "sesame"]);
    let body = r#"{"prompt": "And", "max_tokens": 2}"#;
    for headers in [&[][..], &[("Authorization", "Bearer wrong")][..], &[("Authorization", "sesame")][..]] {
        let (got, text) = s.call("POST", "/v1/completions", Some(body), headers);
        assert_eq!(got, 401, "{headers:?}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "invalid_api_key");
    }
    assert_eq!(s.call("GET", "/v1/models", None, &[]).0, 401);
    assert_eq!(s.call("POST", "/v1/completions", Some(body), &[("Authorization", "Bearer sesame")]).0, 200);
    assert_eq!(s.call("GET", "/health", None, &[]).0, 200, "health stays open");
}

#[test]
fn a_full_queue_is_503_with_retry_after() {
    let s = Serve::start(&["-np", "1", "--max-queue", "0"]);
    let _running = long_stream(&s);
    let r = ureq::post(&s.url("/v1/completions")).send_string(r#"{"prompt": "And", "max_tokens": 2}"#);
    match r {
        Err(ureq::Error::Status(503, resp)) => {
            assert_eq!(resp.header("retry-after"), Some("1"));
            error_message(&serde_json::from_str(&resp.into_string().unwrap()).unwrap());
        }
        other => panic!("expected 503, got {:?}", other.map(|r| r.status())),
    }
    assert_eq!(s.metric("tern_slots_busy"), 1.0);
}

#[test]
fn a_client_that_disconnects_frees_its_slot() {
    let s = Serve::start(&["-np", "1"]);
    let mut r = long_stream(&s);
    let mut buf = [0u8; 256];
    r.read_exact(&mut buf).unwrap();
    drop(r);
    let t0 = Instant::now();
    while s.metric("tern_slots_busy") != 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the slot stayed busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    let after_stream = s.metric("tern_generated_tokens_total");
    assert!(after_stream < 480.0, "the request ran to its end instead of being cancelled");
    assert_eq!(s.metric("tern_queue_depth"), 0.0);
    // A whole-answer request whose client gives up is cancelled too.
    let impatient = ureq::AgentBuilder::new().timeout_read(Duration::from_millis(30)).build();
    let body = json!({"prompt": "And God said", "max_tokens": 480, "temperature": 0}).to_string();
    assert!(impatient.post(&s.url("/v1/completions")).send_string(&body).is_err(), "answered within 30 ms");
    let t0 = Instant::now();
    while s.metric("tern_slots_busy") != 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the slot stayed busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.metric("tern_generated_tokens_total") - after_stream < 480.0, "not cancelled");
    s.ok("/v1/completions", &json!({"prompt": "And", "max_tokens": 2}));
}

#[test]
fn sigterm_stops_the_server_with_exit_0() {
    let mut s = Serve::start(&[]);
    s.ok("/v1/completions", &json!({"prompt": "And", "max_tokens": 2}));
    // A stream running at SIGTERM is finished, then the process exits.
    let mut running = long_stream(&s);
    let kill = Command::new("kill").args(["-TERM", &s.child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "tern serve did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let mut rest = String::new();
    running.read_to_string(&mut rest).unwrap();
    assert!(rest.trim_end().ends_with("data: [DONE]"), "the running stream was cut: {rest}");
}

#[test]
fn a_slot_context_past_the_trained_one_is_refused() {
    let out = tern(&["serve", "--port", "0", "-c", "2048", "-np", "2"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("trained context of 512"), "{err}");
}

#[test]
fn a_model_with_a_chat_template_is_prompted_through_it() {
    let template = "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}> {{ m.content }}\n{% endfor %}\
                    {% if add_generation_prompt %}ASSISTANT>{% endif %}";
    let path = demo_variant("template", |md| md.set("tokenizer.chat_template", GgufValue::String(template.into())));
    let s = Serve::start(&["-m", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path); // mapped by the server: removing the name is enough
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who made the earth?"}]);
    let chat = s.ok("/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 20, "temperature": 0}));
    // The same text as a completion prompt (the completion adds the BOS the template wrote).
    let text = "SYSTEM> Be brief.\nUSER> Who made the earth?\nASSISTANT>";
    let comp = s.ok("/v1/completions", &json!({"prompt": text, "max_tokens": 20, "temperature": 0}));
    assert_eq!(chat["usage"]["prompt_tokens"], comp["usage"]["prompt_tokens"]);
    assert_eq!(chat["choices"][0]["message"]["content"], comp["choices"][0]["text"]);
    let (_, models) = s.call("GET", "/v1/models", None, &[]);
    assert!(models.contains(r#""chat_template":true"#), "{models}");
}

/// `ignore_eos`: on a demo model whose end token is made the first token
/// greedy decoding picks, a request stops at once, and with `ignore_eos`
/// generates all it asks for.
#[test]
fn ignore_eos_generates_past_the_end_token() {
    let prompt = "And God said";
    let tok = tern_tokenizer::Tokenizer::from_metadata(&demo().metadata).unwrap();
    let ids: Vec<String> = tok.encode(prompt, true, true).iter().map(u32::to_string).collect();
    let npy = std::env::temp_dir().join(format!("tern-serve-eos-{}.npy", std::process::id()));
    let out = tern(&["eval", "--tokens", &ids.join(","), "--gen", "1", "--logits-out", npy.to_str().unwrap()]);
    let _ = std::fs::remove_file(&npy);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first: u32 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
    let path = demo_variant("eos", |md| md.set("tokenizer.ggml.eos_token_id", GgufValue::U32(first)));

    let s = Serve::start(&["-m", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let mut body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0});
    let v = s.ok("/v1/completions", &body);
    assert_eq!(
        (v["choices"][0]["finish_reason"].as_str(), v["usage"]["completion_tokens"].as_u64()),
        (Some("stop"), Some(0))
    );
    body["ignore_eos"] = json!(true);
    let v = s.ok("/v1/completions", &body);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
}

/// The official `openai` Python package, unmodified, against the server
/// (`openai_client.py`): models, chat, a streamed chat with usage,
/// completions, an error. Skipped with the reason when python3 cannot
/// import `openai`, unless `TERN_REQUIRE_OPENAI=1` (`.ci/run` installs it).
#[test]
fn the_openai_package_talks_to_it() {
    let probe = Command::new("python3").args(["-c", "import openai"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("TERN_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "TERN_REQUIRE_OPENAI=1 but python3 cannot import openai (PYTHONPATH?)"
        );
        eprintln!("skipped: python3 cannot import the openai package (pip install openai)");
        return;
    }
    let s = Serve::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let out = Command::new("python3").arg(script).arg(s.url("")).output().expect("run python3");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == "ok", "openai client failed:\n{stdout}\n{stderr}");
}
