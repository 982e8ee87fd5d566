"""The server on the real SmolLM2 model, through the `openai` client and raw HTTP: plain and
streamed answers, several conversations at once, prefix reuse, the OpenAI error shapes."""
import json
import threading

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
openai = pytest.importorskip("openai", reason="the test extra's openai client is not installed")

from serve_process import Server, get_json, post  # noqa: E402

pytestmark = pytest.mark.model

MAX_CONTEXT = 1024  # small, so that a context overflow is cheap to provoke
GREEDY = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The memory store: nothing written per turn, so a history that a session has answered since
    # is cold (a store that gets every turn may still hold its earlier turn: docs/serve.md).
    with Server(tmp_path_factory.mktemp("serve"), {"runtime.max_context": MAX_CONTEXT,
                                                   "serve.session_store": "memory",
                                                   "serve.max_tokens_limit": 64,
                                                   "serve.max_body_bytes": 65536}) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def ask(client, messages, **kw):
    return client.chat.completions.create(model="smollm2", messages=messages, **{**GREEDY, **kw})


def extra(usage, name):
    return (usage.model_extra or {})[name]


def test_plain_chat_completion(client):
    r = ask(client, [{"role": "user", "content": "What is the capital of France?"}])
    assert r.object == "chat.completion" and r.model == "smollm2" and r.id.startswith("chatcmpl-")
    (c,) = r.choices
    assert c.message.role == "assistant" and c.message.content.strip()
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.completion_tokens <= GREEDY["max_tokens"] and u.prompt_tokens > 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens == 0
    assert extra(u, "kv_bytes_held") > 0 and extra(u, "whole_model_ratio") > 1.0


def test_streamed_answer_equals_the_plain_one(client):
    messages = [{"role": "user", "content": "Name three colours."}]
    plain = ask(client, messages)
    chunks = list(ask(client, messages, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content  # greedy: the same tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_a_follow_up_prefills_only_the_new_message(client):
    history = [{"role": "system", "content": "You answer in one short sentence."},
               {"role": "user", "content": "Which planet is the largest in the solar system?"}]
    first = ask(client, history)
    history.append({"role": "assistant", "content": first.choices[0].message.content})
    history.append({"role": "user", "content": "How far is it from the Sun?"})
    follow = ask(client, history)
    cached = follow.usage.prompt_tokens_details.cached_tokens
    # The cache held the first turn's prompt and its answer (all but the last answer token,
    # which the next render writes with its end-of-turn marker).
    assert first.usage.prompt_tokens + first.usage.completion_tokens - 1 <= cached
    assert cached <= first.usage.prompt_tokens + first.usage.completion_tokens
    # The same conversation cold (no session holds exactly its history any more: the one above
    # has moved on) prefills everything: what the follow-up reused plus what it prefilled.
    cold = ask(client, history)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert follow.usage.prompt_tokens < 25 < cold.usage.prompt_tokens
    assert abs(cold.usage.prompt_tokens - (follow.usage.prompt_tokens + cached)) <= 2
    assert cold.choices[0].message.content == follow.choices[0].message.content


def test_several_conversations_at_once(client, server):
    questions = ["What is 2 + 2?", "Name a fruit.", "What colour is the sky?", "Say hello in French."]
    # Each question alone first: greedy answers of a new conversation are deterministic, so the
    # answers given while the others run must be the same (requests never corrupt each other).
    alone = {q: ask(client, [{"role": "user", "content": q}]).choices[0].message.content for q in questions}
    results, errors = {}, []

    def converse(q):
        try:
            msgs = [{"role": "user", "content": q}]
            a = ask(client, msgs)
            msgs += [{"role": "assistant", "content": a.choices[0].message.content},
                     {"role": "user", "content": "Why?"}]
            follow = ask(client, msgs, stream=True, stream_options={"include_usage": True})
            results[q] = (a, list(follow))
        except Exception as e:  # reported below, with the question
            errors.append((q, e))

    threads = [threading.Thread(target=converse, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    for q, (first, chunks) in results.items():
        assert first.choices[0].message.content == alone[q], q
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip(), q
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens, q
    assert get_json(server.url + "/health")["sessions_in_memory"] >= len(questions)


def test_plain_completion_uses_no_template(client):
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.prompt_tokens == 5  # the prompt's own tokens, no chat template around them
    chunks = list(client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_models_health_and_page(server, client):
    assert [m.id for m in client.models.list()] == ["smollm2"]
    h = get_json(server.url + "/health")
    assert h["status"] == "ok" and h["kv_budget_bytes"] > 0
    import urllib.request

    with urllib.request.urlopen(server.url + "/") as r:
        page = r.read().decode()
    assert "/v1/chat/completions" in page and "http://" not in page.replace("http://www.w3.org", "")


@pytest.mark.parametrize("body, param, code", [
    (b"{not json", None, "invalid_json"),
    (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "messages[0].role", "invalid_value"),
    (json.dumps({"messages": []}).encode(), "messages", "empty_array"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 65}).encode(), "max_tokens",
     "invalid_value"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 70000}]}).encode(), None, "request_too_large"),
])
def test_bad_requests_get_openai_errors(server, body, param, code):
    status, obj = post(server.url + "/v1/chat/completions", body)
    assert status == 400
    assert set(obj["error"]) == {"message", "type", "param", "code"}
    assert (obj["error"]["param"], obj["error"]["code"]) == (param, code)


def test_unknown_model_is_404_and_overflow_a_clear_400(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "model_not_found"
    long = "word " * (MAX_CONTEXT + 100)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, [{"role": "user", "content": long}], stream=stream)
        assert e.value.body["code"] == "context_length_exceeded"
        assert str(MAX_CONTEXT) in e.value.body["message"]
    # The server goes on answering.
    assert ask(client, [{"role": "user", "content": "Hi"}]).choices[0].message.content
