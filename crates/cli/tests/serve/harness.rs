//! A `tern serve` process on the demo model and a plain HTTP client for it.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Output, Stdio};

use serde_json::{json, Value};

/// A `tern serve` process, killed when dropped.
pub struct Serve {
    pub child: Child,
    pub port: u16,
    /// Kept open: the server's later warnings must not meet a closed pipe.
    stderr: Option<BufReader<ChildStderr>>,
}

impl Serve {
    /// Starts `tern serve --port 0 -t 1 ARGS` and waits for its address line.
    pub fn start(args: &[&str]) -> Serve {
        let command = Command::new(env!("CARGO_BIN_EXE_tern"))
            .args(["serve", "--port", "0", "-t", "1"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = command.expect("start tern serve");
        let stderr = child.stderr.take().map(BufReader::new);
        // Owned by the guard from here on: a failed read below still kills and reaps it.
        let mut s = Serve { child, port: 0, stderr };
        let mut line = String::new();
        loop {
            line.clear();
            let read = s.stderr.as_mut().map_or(0, |e| e.read_line(&mut line).unwrap_or(0));
            assert!(read > 0, "tern serve ended before listening");
            if let Some(at) = line.find("http://127.0.0.1:") {
                let rest = &line[at + "http://127.0.0.1:".len()..];
                s.port = rest[..rest.find(|c: char| !c.is_ascii_digit()).unwrap()].parse().unwrap();
                return s;
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// (status, body) of a request, whatever the status.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = ureq::request(method, &self.url(path));
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let r = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(b),
            None => req.call(),
        };
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        (status, resp.into_string().unwrap())
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.call("POST", path, Some(&body.to_string()), &[]);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}")))
    }

    pub fn ok(&self, path: &str, body: &Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 200, "{path}: {v}");
        v
    }

    /// A streamed request's `data:` payloads, in order.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let resp = ureq::post(&self.url(path)).send_string(&body.to_string()).unwrap();
        assert_eq!(resp.header("content-type"), Some("text/event-stream"));
        let reader = BufReader::new(resp.into_reader());
        reader.lines().map(|l| l.unwrap()).filter_map(|l| l.strip_prefix("data: ").map(str::to_string)).collect()
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.call("GET", "/metrics", None, &[]);
        let line =
            text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {text}"));
        line[name.len() + 1..].parse().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn tern(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tern")).args(args).output().expect("run tern")
}

/// The error object's shape, and its message.
pub fn error_message(v: &Value) -> String {
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "not an OpenAI error object: {v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    e["message"].as_str().unwrap().to_string()
}

/// Starts a long stream and returns its reader once the first token arrived.
pub fn long_stream(s: &Serve) -> impl BufRead {
    let body = json!({"prompt": "And God said", "max_tokens": 480, "temperature": 0, "stream": true});
    let resp = ureq::post(&s.url("/v1/completions")).send_string(&body.to_string()).unwrap();
    let mut r = BufReader::new(resp.into_reader());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    r
}

/// The demo model's file.
pub fn demo() -> tern_gguf::File {
    tern_gguf::File::open(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tern-demo-kjv.gguf")).unwrap()
}

/// A copy of the demo model with `edit` applied to its metadata, in the
/// temporary directory (a server maps it: the caller may remove the name
/// once the server started).
pub fn demo_variant(tag: &str, edit: impl FnOnce(&mut tern_gguf::Metadata)) -> std::path::PathBuf {
    use tern_gguf::{Writer, WriterTensor};
    let demo = demo();
    let mut md = demo.metadata.clone();
    edit(&mut md);
    let mut w = Writer::new(md);
    for t in &demo.tensors {
        w.tensors.push(WriterTensor { name: t.name.clone(), ty: t.ty, dims: t.dims().to_vec() });
    }
    let path = std::env::temp_dir().join(format!("tern-serve-{tag}-{}.gguf", std::process::id()));
    w.write_to_path(&path, |i| Ok(std::borrow::Cow::Borrowed(demo.tensor_data(&demo.tensors[i])))).unwrap();
    path
}
