"""How a reply stopped, when it stopped short: cut off at ``max_tokens``, or by a content filter.

Such a reply is a 200, billed, and stored as sent; aiq counts it apart (``status``, the
summary) and, with ``--on-truncated dead``, dead-letters a cut-off one. The fields, as the
providers document them:

- OpenAI chat and completions: a choice's ``finish_reason`` is ``"length"`` (``max_tokens``
  reached) or ``"content_filter"`` (content omitted by the filters);
- OpenAI Responses: ``status: "incomplete"`` with ``incomplete_details.reason`` of
  ``"max_output_tokens"`` or ``"content_filter"``;
- Anthropic Messages: ``stop_reason`` ``"max_tokens"`` or ``"model_context_window_exceeded"``
  (its docs: "treat the response as truncated"), and ``"refusal"`` (declined for safety);
- a reasoning model that spent the whole budget thinking: empty content beside reasoning
  tokens. OpenAI says ``finish_reason: "length"``; some servers say ``"stop"`` (an empty
  ``content`` beside a full ``reasoning_content``), which is no answer either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .contract import StopKind

TRUNCATED: Final = "truncated"
CONTENT_FILTER: Final = "content_filter"


@dataclass(frozen=True, slots=True)
class Stop:
    """A reply that stopped short: ``kind`` (:data:`TRUNCATED` or :data:`CONTENT_FILTER`) and
    what the reply said, for messages (``finish_reason "length"``)."""

    kind: StopKind
    said: str


def openai_stop(endpoint: str, data: dict[str, Any]) -> Stop | None:
    """How an OpenAI-compatible reply (parsed) stopped short, or None if it did not."""
    if endpoint == "/v1/responses":
        return _responses_stop(data)
    choices = data.get("choices")
    if not isinstance(choices, list):
        return None  # embeddings, or a shape with no choices
    filtered = None
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        reason = choice.get("finish_reason")
        thought = _all_thinking(choice, data.get("usage"))
        if reason == "length":  # the first fix to try: say it
            return Stop(TRUNCATED, 'finish_reason "length"' + (f", {thought}" if thought else ""))
        if reason == "content_filter":
            filtered = Stop(CONTENT_FILTER, 'finish_reason "content_filter"')
        elif thought is not None:
            return Stop(TRUNCATED, f'finish_reason "{reason}", {thought}')
    return filtered


def anthropic_stop(data: dict[str, Any]) -> Stop | None:
    """How an Anthropic Message (parsed) stopped short, or None if it did not."""
    reason = data.get("stop_reason")
    if reason in ("max_tokens", "model_context_window_exceeded"):
        return Stop(TRUNCATED, f'stop_reason "{reason}"')
    if reason == "refusal":
        return Stop(CONTENT_FILTER, 'stop_reason "refusal"')
    return None


def _responses_stop(data: dict[str, Any]) -> Stop | None:
    if data.get("status") != "incomplete":
        return None
    details = data.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    said = f'status "incomplete" ({reason or "no reason given"})'
    return Stop(CONTENT_FILTER if reason == "content_filter" else TRUNCATED, said)


def _all_thinking(choice: dict[str, Any], usage: Any) -> str | None:
    """What says a choice's answer was lost to reasoning: no text and no tool call, beside
    reasoning tokens or reasoning text; None when it has an answer (or no reasoning)."""
    message = choice.get("message")
    if isinstance(message, dict):
        if message.get("content") or message.get("tool_calls") or message.get("function_call"):
            return None
        thought = message.get("reasoning_content") or message.get("reasoning")
    elif "text" in choice:  # completions
        if choice.get("text"):
            return None
        thought = None
    else:
        return None
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return f"no answer after {tokens:,} reasoning tokens"
    if isinstance(thought, str) and thought:
        return f"no answer after {len(thought):,} characters of reasoning"
    return None


def stop_message(stop: Stop, tokens_out: int, *, dead: bool) -> str:
    """What a job's reply that stopped short says, in its error message (and dead letter)."""
    if stop.kind == CONTENT_FILTER:
        return (
            f"the reply was stopped by a content filter ({stop.said}); kept as sent, as a "
            "result: the same request is likely refused again, so rephrase it or use another "
            "model"
        )
    text = (
        f"the reply was cut off at max_tokens ({stop.said}, {tokens_out:,} tokens out, billed); "
        "raise max_tokens (in the input line, or max_tokens: in the config for lines that name "
        "none) and run the file again with aiq run: a changed line is sent anew"
    )
    if dead:
        text += (
            "; `aiq replay-dead --error truncated` then `aiq resume` sends it again unchanged. "
            "The reply as sent is in this dead letter's response"
        )
    return text
