"""How a reply stopped short, read from each API's fields (aiq.stops): a table of replies."""

from __future__ import annotations

from typing import Any

import pytest

from aiq.stops import CONTENT_FILTER, TRUNCATED, anthropic_stop, openai_stop, stop_message

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


def chat(finish: str | None, content: Any = "an answer", **message: Any) -> dict[str, Any]:
    msg = {"role": "assistant", "content": content, **message}
    return {"choices": [{"index": 0, "message": msg, "finish_reason": finish}]}


def reasoning(tokens: int) -> dict[str, Any]:
    return {"completion_tokens": tokens, "completion_tokens_details": {"reasoning_tokens": tokens}}


@pytest.mark.parametrize(
    ("endpoint", "reply", "kind"),
    [
        (CHAT, chat("stop"), None),
        (CHAT, chat("tool_calls", None, tool_calls=[{"id": "c"}]), None),
        (CHAT, chat("length"), TRUNCATED),
        (CHAT, chat("content_filter", None), CONTENT_FILTER),
        # A reasoning model's whole budget spent thinking: OpenAI says "length" ...
        (CHAT, {**chat("length", ""), "usage": reasoning(512)}, TRUNCATED),
        # ... some servers "stop", with the thinking beside an empty answer: no answer either.
        (CHAT, {**chat("stop", ""), "usage": reasoning(512)}, TRUNCATED),
        (CHAT, chat("stop", "", reasoning_content="Let me think"), TRUNCATED),
        (CHAT, chat("stop", ""), None),  # empty, but nothing says it was cut: the model's answer
        (CHAT, {**chat("stop", "ok"), "usage": reasoning(512)}, None),  # thought, then answered
        # n > 1: any choice cut off is a cut-off reply.
        (CHAT, {"choices": [*chat("stop")["choices"], *chat("length")["choices"]]}, TRUNCATED),
        (CHAT, {"choices": [*chat("content_filter")["choices"], *chat("stop")["choices"]]},
         CONTENT_FILTER),
        (COMPLETIONS, {"choices": [{"text": "abc", "finish_reason": "length"}]}, TRUNCATED),
        (COMPLETIONS, {"choices": [{"text": "", "finish_reason": "content_filter"}]},
         CONTENT_FILTER),
        (COMPLETIONS, {"choices": [{"text": "abc", "finish_reason": "stop"}]}, None),
        (RESPONSES, {"status": "completed", "output": []}, None),
        (RESPONSES, {"status": "incomplete",
                     "incomplete_details": {"reason": "max_output_tokens"}}, TRUNCATED),
        (RESPONSES, {"status": "incomplete",
                     "incomplete_details": {"reason": "content_filter"}}, CONTENT_FILTER),
        (RESPONSES, {"status": "incomplete", "incomplete_details": None}, TRUNCATED),
        ("/v1/embeddings", {"data": [{"embedding": [0.1]}]}, None),
        (CHAT, {"choices": "garbled"}, None),
        (CHAT, {"choices": [None, 3]}, None),
    ],
)  # fmt: skip
def test_openai_replies(endpoint: str, reply: dict[str, Any], kind: str | None) -> None:
    stop = openai_stop(endpoint, reply)
    assert (stop.kind if stop else None) == kind


@pytest.mark.parametrize(
    ("stop_reason", "kind"),
    [
        ("end_turn", None),
        ("stop_sequence", None),
        ("tool_use", None),
        ("pause_turn", None),
        ("max_tokens", TRUNCATED),
        ("model_context_window_exceeded", TRUNCATED),  # its docs: treat as truncated
        ("refusal", CONTENT_FILTER),
        (None, None),
    ],
)
def test_anthropic_replies(stop_reason: str | None, kind: str | None) -> None:
    stop = anthropic_stop({"content": [], "stop_reason": stop_reason})
    assert (stop.kind if stop else None) == kind
    if stop is not None:
        assert stop_reason is not None and stop_reason in stop.said  # quotes what it said


def test_messages_say_what_to_do() -> None:
    cut = openai_stop(CHAT, chat("length"))
    assert cut is not None
    kept = stop_message(cut, 512, dead=False)
    dead = stop_message(cut, 512, dead=True)
    for text in (kept, dead):
        assert "raise max_tokens" in text and '"length"' in text and "512 tokens out" in text
    assert "aiq replay-dead --error truncated" in dead and "replay-dead" not in kept
    filtered = openai_stop(CHAT, chat("content_filter"))
    assert filtered is not None
    assert "content filter" in stop_message(filtered, 0, dead=False)
