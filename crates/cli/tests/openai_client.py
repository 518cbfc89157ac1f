"""tern serve through the official `openai` package, unmodified: models,
chat, a streamed chat with usage, completions, and an error. Run by
serve.rs's `the_openai_package_talks_to_it` with the server's base URL."""
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
model = client.models.list().data[0].id
ask = [{"role": "user", "content": "Who made the heaven and the earth?"}]

whole = client.chat.completions.create(model=model, messages=ask, max_tokens=16, temperature=0)
text = whole.choices[0].message.content
assert text and whole.choices[0].finish_reason == "length", whole
assert whole.usage.completion_tokens == 16 and whole.usage.prompt_tokens > 0, whole.usage

chunks = list(client.chat.completions.create(model=model, messages=ask, max_tokens=16, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert streamed == text, (streamed, text)
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16, chunks[-1]

done = client.completions.create(model=model, prompt="And God said", max_tokens=8, temperature=0)
assert done.choices[0].text and done.usage.completion_tokens == 8, done

try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "and " * 2000}], max_tokens=4)
    sys.exit("a prompt longer than the context was accepted")
except openai.BadRequestError as e:
    assert "context" in str(e), e
print("ok")
