//! Real chat templates (testdata/templates, copied from llama.cpp's
//! models/templates) rendered with an ordinary conversation.

mod common;
use common::*;
use tern_tokenizer::{ChatTemplate, Message};

fn template(name: &str, bos: &str, eos: &str) -> ChatTemplate {
    let src = std::fs::read_to_string(testdata(&format!("templates/{name}"))).unwrap();
    ChatTemplate::new(&src, bos, eos).unwrap()
}

/// System, user, assistant, user: the shape of a second `tern chat` turn.
fn conversation() -> Vec<Message> {
    vec![
        Message::new("system", "You are a helpful assistant."),
        Message::new("user", "Hello!"),
        Message::new("assistant", "Hi there. How can I help?"),
        Message::new("user", "What is 2+2?"),
    ]
}

#[test]
fn qwen3_template() {
    let t = template("Qwen-Qwen3-0.6B.jinja", "<|endoftext|>", "<|im_end|>");
    assert_eq!(
        t.render(&conversation(), true).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHello!<|im_end|>\n\
         <|im_start|>assistant\nHi there. How can I help?<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn deepseek_v31_template() {
    let t = template("deepseek-ai-DeepSeek-V3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    assert_eq!(
        t.render(&conversation(), true).unwrap(),
        "<｜begin▁of▁sentence｜>You are a helpful assistant.\
         <｜User｜>Hello!<｜Assistant｜><think></think>Hi there. How can I help?<｜end▁of▁sentence｜>\
         <｜User｜>What is 2+2?<｜Assistant｜><think></think>"
    );
}

/// Thinking: the last answer keeps its `<think>` block, earlier ones lose
/// it; `lstrip('\n')` must strip newlines only, as in Python.
#[test]
fn qwen3_template_thinking() {
    let t = template("Qwen-Qwen3-0.6B.jinja", "<|endoftext|>", "<|im_end|>");
    let mut msgs = conversation();
    msgs[2] = Message::new("assistant", "<think>\n  Let me think.  \n</think>\n\n  The answer.");
    msgs.push(Message::new("assistant", "<think>\nSecond.\n</think>\n\nDone."));
    assert_eq!(
        t.render(&msgs, false).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHello!<|im_end|>\n\
         <|im_start|>assistant\n  The answer.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n<think>\nSecond.\n</think>\n\nDone.<|im_end|>\n"
    );
}

/// DeepSeek drops the reasoning of earlier answers with `split('</think>', 1)`.
#[test]
fn deepseek_v31_template_thinking() {
    let t = template("deepseek-ai-DeepSeek-V3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    let mut msgs = conversation();
    msgs[2] = Message::new("assistant", "<think>x</think>A</think>B");
    let out = t.render(&msgs, true).unwrap();
    assert!(out.contains("<｜Assistant｜><think></think>A</think>B<｜end▁of▁sentence｜>"), "{out}");
}

/// No system message: Qwen3 starts with the user; DeepSeek with BOS alone.
#[test]
fn templates_without_system() {
    let msgs = &conversation()[1..2];
    let qwen = template("Qwen-Qwen3-0.6B.jinja", "<|endoftext|>", "<|im_end|>");
    assert_eq!(qwen.render(msgs, true).unwrap(), "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    let ds = template("deepseek-ai-DeepSeek-V3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    assert_eq!(ds.render(msgs, false).unwrap(), "<｜begin▁of▁sentence｜><｜User｜>Hello!");
}

/// The cases of `tools/tokenizer/render_templates.py` (keep the two in
/// step): name, messages, `add_generation_prompt`.
fn reference_cases() -> Vec<(&'static str, Vec<Message>, bool)> {
    let talk = conversation();
    let mut thinking = talk.clone();
    thinking[2] = Message::new("assistant", "<think>\n  Let me think.  \n</think>\n\n  The answer.");
    thinking.push(Message::new("assistant", "<think>\nSecond.\n</think>\n\nDone."));
    let tool_response = vec![
        talk[0].clone(),
        Message::new("user", "What is 6*7?"),
        Message::new("assistant", "<think>\nMultiply.\n</think>\n\nLet me check."),
        Message::new("user", "<tool_response>\n42\n</tool_response>"),
        Message::new("assistant", "<think>\nIt is 42.\n</think>\n\n6*7 = 42."),
    ];
    vec![
        ("conversation", talk.clone(), true),
        ("thinking", thinking, false),
        ("no-system", talk[1..2].to_vec(), true),
        ("tool-response", tool_response, false),
    ]
}

/// Every reference case rendered by tern equals what Python's jinja2, set
/// up as transformers sets it up, wrote into `testdata/templates/rendered`.
fn check_against_jinja2(stem: &str, bos: &str, eos: &str) {
    let t = template(&format!("{stem}.jinja"), bos, eos);
    for (case, messages, add_generation_prompt) in reference_cases() {
        let want = std::fs::read_to_string(testdata(&format!("templates/rendered/{stem}.{case}.txt"))).unwrap();
        let got = t.render(&messages, add_generation_prompt).unwrap();
        assert_eq!(got, want, "{stem}, case {case}");
    }
}

#[test]
fn qwen3_template_matches_jinja2() {
    check_against_jinja2("Qwen-Qwen3-0.6B", "<|endoftext|>", "<|im_end|>");
}

#[test]
fn deepseek_v31_template_matches_jinja2() {
    check_against_jinja2("deepseek-ai-DeepSeek-V3.1", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
}

/// A template that fails is one error naming the problem, not a panic.
#[test]
fn template_errors() {
    let qwen = template("Qwen-Qwen3-0.6B.jinja", "<|endoftext|>", "<|im_end|>");
    // Qwen3 reads messages[0].role unconditionally.
    let err = qwen.render(&[], true).unwrap_err().to_string();
    assert!(err.starts_with("chat template: ") && err.contains("undefined"), "{err}");
    let bad = ChatTemplate::new("{{ messages[0].content.split('') }}", "", "").unwrap();
    let err = bad.render(&conversation(), true).unwrap_err().to_string();
    assert!(err.contains("empty separator"), "{err}");
    assert!(ChatTemplate::new("{% for m in messages %}", "", "").is_err());
}
