//! What chat templates written for Hugging Face transformers expect of their
//! Jinja environment beyond minijinja's defaults: the block whitespace
//! settings, `raise_exception`, Python's `str` and `dict` methods, and a
//! `tojson` that writes JSON the way Python's `json.dumps` does.
//!
//! minijinja's own `tojson` needs `serde_json` and escapes `<`, `>`, `&` and
//! `'` for HTML, which would change the prompt the model was trained on. The
//! methods are what `minijinja-contrib`'s `pycompat` would add, limited to
//! the ones chat templates call.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};

/// Configures `env` like the sandboxed environment transformers renders
/// chat templates in (llama.cpp's template engine follows the same rules).
pub(crate) fn install(env: &mut Environment<'_>) {
    // transformers sets both, and templates rely on them: without
    // `trim_blocks` the newline after every `{% ... %}` line reaches the prompt.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("tojson", tojson);
    env.set_unknown_method_callback(python_methods);
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// Python methods on strings and dicts, called as `s.strip()`, `d.items()`.
fn python_methods(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::String => str_method(value.as_str().unwrap_or_default(), method, args),
        ValueKind::Map => map_method(state, value, method, args),
        kind => Err(Error::new(ErrorKind::UnknownMethod, format!("{kind} has no method {method}"))),
    }
}

/// The arguments of one method call, checked as Python would check them.
struct Args<'a> {
    method: &'a str,
    args: &'a [Value],
}

impl<'a> Args<'a> {
    fn new(method: &'a str, args: &'a [Value], max: usize) -> Result<Args<'a>, Error> {
        if args.len() > max {
            return Err(invalid(format!("{method}() takes at most {max} arguments ({} given)", args.len())));
        }
        Ok(Args { method, args })
    }

    /// Argument `i` as a string; `None` when absent or `none`.
    fn str(&self, i: usize) -> Result<Option<&'a str>, Error> {
        match self.args.get(i) {
            None => Ok(None),
            Some(v) if v.is_none() || v.is_undefined() => Ok(None),
            Some(v) => match v.as_str() {
                Some(s) => Ok(Some(s)),
                None => {
                    Err(invalid(format!("{}() argument {} must be a string, not {}", self.method, i + 1, v.kind())))
                }
            },
        }
    }

    fn required_str(&self, i: usize) -> Result<&'a str, Error> {
        self.str(i)?.ok_or_else(|| invalid(format!("{}() is missing argument {}", self.method, i + 1)))
    }

    /// Argument `i` as an integer; -1 (Python's "no limit") when absent.
    fn count(&self, i: usize) -> Result<i64, Error> {
        match self.args.get(i) {
            None => Ok(-1),
            Some(v) => v.as_i64().ok_or_else(|| {
                invalid(format!("{}() argument {} must be an integer, not {}", self.method, i + 1, v.kind()))
            }),
        }
    }
}

fn str_method(s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let max_args = match method {
        "lower" | "upper" | "title" | "capitalize" => 0,
        "strip" | "lstrip" | "rstrip" | "startswith" | "endswith" | "count" | "find" | "join" => 1,
        "split" | "rsplit" => 2,
        "replace" => 3,
        _ => return Err(Error::new(ErrorKind::UnknownMethod, format!("string has no method {method}"))),
    };
    let a = Args::new(method, args, max_args)?;
    Ok(match method {
        "strip" | "lstrip" | "rstrip" => {
            let (left, right) = (method != "rstrip", method != "lstrip");
            Value::from(match a.str(0)? {
                None if left && right => s.trim(),
                None if left => s.trim_start(),
                None => s.trim_end(),
                // Python strips any of the given characters, not the string.
                Some(chars) => {
                    let set = |c: char| chars.contains(c);
                    match (left, right) {
                        (true, true) => s.trim_matches(set),
                        (true, false) => s.trim_start_matches(set),
                        _ => s.trim_end_matches(set),
                    }
                }
            })
        }
        "lower" => Value::from(s.to_lowercase()),
        "upper" => Value::from(s.to_uppercase()),
        "title" => Value::from(title(s)),
        "capitalize" => {
            let mut cs = s.chars();
            let head: String = cs.next().map(|c| c.to_uppercase().collect()).unwrap_or_default();
            Value::from(head + &cs.as_str().to_lowercase())
        }
        "startswith" | "endswith" => {
            let test = |p: &str| if method == "startswith" { s.starts_with(p) } else { s.ends_with(p) };
            match args.first() {
                // Python also takes a tuple of candidates.
                Some(v) if matches!(v.kind(), ValueKind::Seq) => {
                    let mut hit = false;
                    for p in v.try_iter()? {
                        let p = p.as_str().ok_or_else(|| invalid(format!("{method}() candidates must be strings")))?;
                        hit |= test(p);
                    }
                    Value::from(hit)
                }
                _ => Value::from(test(a.required_str(0)?)),
            }
        }
        "replace" => {
            let (old, new) = (a.required_str(0)?, a.required_str(1)?);
            match a.count(2)? {
                n if n < 0 => Value::from(s.replace(old, new)),
                n => Value::from(s.replacen(old, new, n as usize)),
            }
        }
        "split" | "rsplit" => split(s, a.str(0)?, a.count(1)?, method == "rsplit")?,
        "count" => Value::from(s.matches(a.required_str(0)?).count()),
        // Python counts characters, not bytes.
        "find" => Value::from(s.find(a.required_str(0)?).map_or(-1, |b| s[..b].chars().count() as i64)),
        _ => {
            // "join", the last method `max_args` lets through.
            let items = args.first().ok_or_else(|| invalid("join() is missing argument 1".into()))?;
            let mut parts = Vec::new();
            for item in items.try_iter()? {
                match item.as_str() {
                    Some(p) => parts.push(p.to_string()),
                    None => return Err(invalid(format!("join() items must be strings, not {}", item.kind()))),
                }
            }
            Value::from(parts.join(s))
        }
    })
}

/// Python's `str.title`: each run of letters starts upper case, the rest lower.
fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_word = false;
    for c in s.chars() {
        if in_word {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        in_word = c.is_alphabetic();
    }
    out
}

/// Python's `str.split` / `str.rsplit`: `sep = None` splits on whitespace
/// runs and drops empty parts; `maxsplit < 0` means no limit.
fn split(s: &str, sep: Option<&str>, maxsplit: i64, from_right: bool) -> Result<Value, Error> {
    let parts: Vec<&str> = match (sep, maxsplit < 0) {
        (Some(""), _) => return Err(invalid("empty separator".into())),
        (Some(sep), true) => s.split(sep).collect(),
        (Some(sep), false) if from_right => {
            let mut v: Vec<&str> = s.rsplitn(maxsplit as usize + 1, sep).collect();
            v.reverse();
            v
        }
        (Some(sep), false) => s.splitn(maxsplit as usize + 1, sep).collect(),
        (None, true) => s.split_whitespace().collect(),
        (None, false) if from_right => {
            let mut v: Vec<&str> = split_whitespace_n(&s.chars().rev().collect::<String>(), maxsplit as usize)
                .into_iter()
                .map(|p| &s[s.len() - p.1..s.len() - p.0])
                .collect();
            v.reverse();
            v
        }
        (None, false) => split_whitespace_n(s, maxsplit as usize).into_iter().map(|p| &s[p.0..p.1]).collect(),
    };
    Ok(Value::from(parts.into_iter().map(str::to_string).collect::<Vec<_>>()))
}

/// Byte ranges of the whitespace-separated words of `s`, at most `n` splits:
/// the last range runs to the end of `s` (trailing whitespace included), as
/// in Python.
fn split_whitespace_n(s: &str, n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut rest = s.len() - s.trim_start().len();
    while rest < s.len() {
        if out.len() == n {
            out.push((rest, s.len()));
            break;
        }
        let end = s[rest..].find(char::is_whitespace).map_or(s.len(), |e| rest + e);
        out.push((rest, end));
        rest = s.len() - s[end..].trim_start().len();
    }
    out
}

fn map_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let no_args = || Args::new(method, args, 0);
    Ok(match method {
        "items" => {
            no_args()?;
            state.apply_filter("items", std::slice::from_ref(value))?
        }
        "keys" => {
            no_args()?;
            Value::from(value.try_iter()?.collect::<Vec<_>>())
        }
        "values" => {
            no_args()?;
            let mut out = Vec::new();
            for k in value.try_iter()? {
                out.push(value.get_item(&k)?);
            }
            Value::from(out)
        }
        "get" => {
            Args::new(method, args, 2)?;
            let key = args.first().ok_or_else(|| invalid("get() is missing its key".into()))?;
            match value.get_item(key)? {
                v if v.is_undefined() => args.get(1).cloned().unwrap_or(Value::from(())),
                v => v,
            }
        }
        _ => return Err(Error::new(ErrorKind::UnknownMethod, format!("map has no method {method}"))),
    })
}

/// `tojson` as transformers defines it: `json.dumps` with non-ASCII kept,
/// `", "` and `": "` separators, and an optional `indent`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(v.as_usize().ok_or_else(|| invalid(format!("tojson indent must be a count, not {v}")))?),
    };
    let mut out = String::new();
    write_json(value, indent, 0, &mut out)?;
    Ok(Value::from(out))
}

fn write_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) -> Result<(), Error> {
    // Python puts a newline and the indentation before each item when
    // indenting, and a space after each comma otherwise.
    let item_sep = |out: &mut String, first: bool, depth: usize| {
        if !first {
            out.push(',');
        }
        match indent {
            Some(n) => {
                out.push('\n');
                out.push_str(&" ".repeat(n * depth));
            }
            None if !first => out.push(' '),
            None => {}
        }
    };
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&match f {
                f if f.is_nan() => "NaN".to_string(),
                f if f.is_infinite() => if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string(),
                f => format!("{f:?}"),
            });
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            let mut first = true;
            for item in v.try_iter()? {
                item_sep(out, first, depth + 1);
                write_json(&item, indent, depth + 1, out)?;
                first = false;
            }
            if !first && indent.is_some() {
                item_sep(out, true, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            let mut first = true;
            for key in v.try_iter()? {
                item_sep(out, first, depth + 1);
                match key.as_str() {
                    Some(k) => write_json_str(k, out),
                    // Python turns number and bool keys into strings.
                    None => write_json_str(&key.to_string(), out),
                }
                out.push_str(": ");
                write_json(&v.get_item(&key)?, indent, depth + 1, out)?;
                first = false;
            }
            if !first && indent.is_some() {
                item_sep(out, true, depth);
            }
            out.push('}');
        }
        kind => return Err(invalid(format!("tojson cannot write a value of type {kind}"))),
    }
    Ok(())
}

/// `s` as a JSON string literal, escaped as Python's `json.dumps` does with
/// `ensure_ascii=False`: quotes, backslashes and control characters; any
/// other character as itself. The one JSON string writer of the workspace
/// (`tern info --json` and the bench outputs use it too).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_json_str(s, &mut out);
    out
}

fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    fn render(src: &str, ctx: Value) -> Result<String, Error> {
        let mut env = Environment::new();
        install(&mut env);
        env.render_str(src, ctx)
    }

    fn eval(expr: &str) -> String {
        render(&format!("{{{{ {expr} }}}}"), context! {}).unwrap()
    }

    #[test]
    fn string_methods_follow_python() {
        assert_eq!(eval("'\\n\\n  a  \\n'.lstrip('\\n')"), "  a  \n");
        assert_eq!(eval("'xxaxx'.strip('x') ~ '|' ~ ' a '.rstrip() ~ '|'"), "a| a|");
        assert_eq!(eval("'a</t>b</t>c'.split('</t>', 1)"), r#"["a", "b</t>c"]"#);
        assert_eq!(eval("'a</t>b</t>c'.rsplit('</t>', 1)"), r#"["a</t>b", "c"]"#);
        assert_eq!(eval("'a</t>b'.split('</t>')[-1]"), "b");
        assert_eq!(eval("'  a b\\t c '.split()"), r#"["a", "b", "c"]"#);
        assert_eq!(eval("'  a b\\t c '.split(none, 1)"), r#"["a", "b\t c "]"#);
        assert_eq!(eval("'  a b\\t c '.rsplit(none, 1)"), r#"["  a b", "c"]"#);
        assert_eq!(eval("'<a>'.startswith(('x', '<')) ~ 'ab'.endswith('b')"), "TrueTrue");
        assert_eq!(eval("'aaa'.replace('a', 'b', 2) ~ 'hello wORLD'.title() ~ 'éa'.capitalize()"), "bbaHello WorldÉa");
        assert_eq!(eval("'ababa'.count('ab') ~ 'héllo'.find('l') ~ ', '.join(['a', 'b'])"), "22a, b");
    }

    #[test]
    fn map_methods() {
        let ctx = context! { d => context! { a => 1, b => "x" } };
        let out = render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.get('z') is none }}", ctx)
            .unwrap();
        assert_eq!(out, "a=1;b=x;10True");
    }

    #[test]
    fn json_strings_like_json_dumps() {
        assert_eq!(json_string("a\"b\\\n\u{1}"), "\"a\\\"b\\\\\\n\\u0001\"");
        assert_eq!(json_string("\u{8}\u{c}\r\t\u{1f}"), r#""\b\f\r\t\u001f""#);
        assert_eq!(json_string("é<'>"), "\"é<'>\"");
    }

    #[test]
    fn tojson_like_json_dumps() {
        let ctx = context! { t => context! { name => "f<'\"é\n>", args => vec![1, 2], none => () } };
        let out = render("{{ t | tojson }}", ctx.clone()).unwrap();
        assert_eq!(out, r#"{"name": "f<'\"é\n>", "args": [1, 2], "none": null}"#);
        let out =
            render("{{ t.args | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ 1.5 | tojson }}", ctx).unwrap();
        assert_eq!(out, "[\n  1,\n  2\n]|[]|1.5");
    }

    #[test]
    fn block_whitespace_like_transformers() {
        let ctx = context! { xs => vec!["a", "b"] };
        let out = render("{% for x in xs %}\n    {% if x %}\n  {{ x }}\n    {% endif %}\n{% endfor %}\n", ctx).unwrap();
        assert_eq!(out, "  a\n  b\n");
    }

    #[test]
    fn bad_calls_are_errors() {
        for (src, want) in [
            ("{{ 'a'.strip(1) }}", "strip() argument 1 must be a string, not number"),
            ("{{ 'a'.split('') }}", "empty separator"),
            ("{{ 'a'.startswith() }}", "startswith() is missing argument 1"),
            ("{{ 'a'.replace('a') }}", "replace() is missing argument 2"),
            ("{{ 'a'.lower(1) }}", "lower() takes at most 0 arguments (1 given)"),
            ("{{ 'a'.nope() }}", "string has no method nope"),
            ("{{ [1].strip() }}", "sequence has no method strip"),
            ("{{ 'a' | tojson(indent='x') }}", "tojson indent must be a count"),
            ("{{ x | tojson }}", "tojson cannot write a value of type undefined"),
        ] {
            let err = render(src, context! {}).unwrap_err().to_string();
            assert!(err.contains(want), "{src}: {err}");
        }
    }
}
