"""A crash and a clean stop: the conversations saved to disk load in the next server on the same
session directory and continue; those only in memory at a crash start over (docs/serve.md,
"What survives a crash")."""
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from serve_process import Server, get_json, post  # noqa: E402

pytestmark = pytest.mark.model

QUESTIONS = ["Name a large animal.", "Name a small bird.", "Name a cold place."]


def test_sessions_on_disk_survive_kill_9_and_all_survive_a_clean_stop(tmp_path):
    import json

    # The least budget: only the conversation just answered stays in memory, the others are on disk.
    settings = {"serve.kv_budget_bytes": 1, "serve.session_dir": str(tmp_path / "sessions")}

    def ask(server, messages):
        status, r = post(server.url + "/v1/chat/completions",
                         json.dumps({"messages": messages, "max_tokens": 6, "temperature": 0}).encode())
        assert status == 200, r
        assert r["choices"][0]["finish_reason"] in ("stop", "length") and r["usage"]["completion_tokens"] >= 1
        messages.append(r["choices"][0]["message"])
        return r["usage"]

    def follow_up(server, conv, text):
        conv.append({"role": "user", "content": text})
        return ask(server, conv)

    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    with Server(tmp_path, settings) as first:
        for c in convs:
            ask(first, c)
        health = get_json(first.url + "/health")
        assert (health["sessions_saved"], health["sessions_in_memory"]) == (2, 1)
        first.kill()  # kill -9 mid-run: the last conversation's cache was only in memory

    with Server(tmp_path, settings) as second:
        assert get_json(second.url + "/health")["sessions_saved"] == 2
        usages = [follow_up(second, c, "And another one?") for c in convs]
        assert [u["session"] for u in usages] == ["restored", "restored", "new"]
        for u in usages[:2]:  # the restored ones prefill the new message only
            assert u["prompt_tokens_details"]["cached_tokens"] > 0 and u["prompt_tokens"] < 20
        # The lost one prefilled its whole history again, and answered all the same.
        assert usages[2]["prompt_tokens"] > usages[0]["prompt_tokens"] + 10
        assert second.stop() == 0  # Ctrl-C: a clean stop saves every conversation in memory

    with Server(tmp_path, settings) as third:
        assert get_json(third.url + "/health")["sessions_saved"] == 3
        usages = [follow_up(third, c, "One more, please.") for c in convs]
        assert [u["session"] for u in usages] == ["restored"] * 3
        assert get_json(third.url + "/health")["restore_failed"] == 0
