#!/usr/bin/env python3
"""Reference renderings of the chat templates in testdata/templates.

Renders each template with Python's jinja2 in the environment Hugging Face
transformers uses for chat templates (`apply_chat_template`): a sandboxed
environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, `raise_exception`, and a `tojson` that is `json.dumps` with
non-ASCII characters kept. The variables are the ones tern passes:
`messages`, `add_generation_prompt`, `bos_token` and `eos_token`.

    pip install jinja2
    python3 tools/tokenizer/render_templates.py   # from the repository root

rewrites testdata/templates/rendered/<template>.<case>.txt (the exact text,
no newline added); crates/tokenizer/tests/templates.rs renders the same
cases through tern's template code and compares. The cases below must stay
in step with `CASES` there.
"""

import argparse
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = {
    # file stem: (bos_token, eos_token)
    "Qwen-Qwen3-0.6B": ("<|endoftext|>", "<|im_end|>"),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}


def msg(role, content):
    return {"role": role, "content": content}


# System, user, assistant, user: the shape of a second `tern chat` turn.
CONVERSATION = [
    msg("system", "You are a helpful assistant."),
    msg("user", "Hello!"),
    msg("assistant", "Hi there. How can I help?"),
    msg("user", "What is 2+2?"),
]

CASES = {
    # name: (messages, add_generation_prompt)
    "conversation": (CONVERSATION, True),
    # Earlier answers with reasoning, and a last answer with it: Qwen3 keeps
    # the reasoning of the answers after the last user turn only; DeepSeek
    # drops everything up to the first `</think>`.
    "thinking": (
        CONVERSATION[:2]
        + [msg("assistant", "<think>\n  Let me think.  \n</think>\n\n  The answer.")]
        + CONVERSATION[3:]
        + [msg("assistant", "<think>\nSecond.\n</think>\n\nDone.")],
        False,
    ),
    "no-system": (CONVERSATION[1:2], True),
    # A tool result passed back as a user turn: Qwen3 does not count it as
    # the last query (`startswith` / `endswith` over `messages[::-1]`), so
    # both answers after the real question keep their reasoning.
    "tool-response": (
        [
            CONVERSATION[0],
            msg("user", "What is 6*7?"),
            msg("assistant", "<think>\nMultiply.\n</think>\n\nLet me check."),
            msg("user", "<tool_response>\n42\n</tool_response>"),
            msg("assistant", "<think>\nIt is 42.\n</think>\n\n6*7 = 42."),
        ],
        False,
    ),
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def main():
    root = pathlib.Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--templates", type=pathlib.Path, default=root / "testdata/templates")
    args = ap.parse_args()

    env = environment()
    out_dir = args.templates / "rendered"
    out_dir.mkdir(exist_ok=True)
    for stem, (bos, eos) in TEMPLATES.items():
        template = env.from_string((args.templates / f"{stem}.jinja").read_text(encoding="utf-8"))
        for case, (messages, add_generation_prompt) in CASES.items():
            text = template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos
            )
            path = out_dir / f"{stem}.{case}.txt"
            path.write_bytes(text.encode("utf-8"))
            print(f"{path}: {len(text)} characters")
    print(f"jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
