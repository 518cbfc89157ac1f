//! Minimal JSON emission for `--json` outputs (no serde in the CLI).

/// A JSON string literal: the tokenizer's, which chat templates' `tojson`
/// writes with.
pub use tern_tokenizer::json_string as string;

/// `{"k": v, ...}` from already-encoded values.
pub fn object(fields: &[(&str, String)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{}: {v}", string(k))).collect();
    format!("{{{}}}", body.join(", "))
}

pub fn array(items: &[String]) -> String {
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    /// Keys are escaped; values go in as encoded (the escaping itself is
    /// tested with `tern_tokenizer::json_string`).
    #[test]
    fn objects_and_arrays() {
        assert_eq!(super::object(&[("x", "1".into()), ("a\"b", super::string("c"))]), "{\"x\": 1, \"a\\\"b\": \"c\"}");
        assert_eq!(super::array(&["1".into(), "null".into()]), "[1, null]");
    }
}
