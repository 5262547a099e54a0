"""Turn a queued job into the body of an Anthropic Messages request (``POST /v1/messages``).

A ``/v1/messages`` job (a Message Batches line) is Anthropic's own shape and goes as it is. A
chat or prompt job holds an OpenAI ``/v1/chat/completions`` or ``/v1/completions`` body, which
maps onto Messages field by field:

- ``system`` (and ``developer``) messages → the top-level ``system``, joined by blank lines;
- ``user`` / ``assistant`` messages as they are; text parts → text blocks, ``image_url`` parts →
  image blocks (a ``data:`` URL becomes a base64 source);
- ``max_completion_tokens`` or ``max_tokens`` → ``max_tokens``; with neither, the configured
  default (:data:`DEFAULT_MAX_TOKENS` unless the config sets ``max_tokens``): Anthropic requires it;
- ``temperature``, ``top_p`` as they are; ``stop`` → ``stop_sequences``; ``user`` →
  ``metadata.user_id``;
- a completions ``prompt`` → one user message.

Anything else has no faithful translation (``n`` > 1, tools, ``response_format``, penalties…).
Dropping it would silently change what was asked, so such a job is refused with a permanent
``invalid_request`` error naming the field, and dead-letters without being sent.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..registry import ANTHROPIC_MAX_TOKENS as DEFAULT_MAX_TOKENS
from .base import ProviderError

__all__ = ["DEFAULT_MAX_TOKENS", "refuse", "to_messages_body"]

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"
_EMBEDDINGS = "/v1/embeddings"
_MESSAGES = "/v1/messages"

# Fields translated below, and Anthropic's own names, which a chat line may carry as they are.
_HANDLED = frozenset(
    {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature"}
    | {"top_p", "stop", "n", "user", "stream"}
)
_NATIVE = frozenset({"top_k", "stop_sequences", "metadata"})
_MESSAGE_KEYS = frozenset({"role", "content"})


def refuse(message: str) -> ProviderError:
    """A permanent error for a job Anthropic cannot run: it dead-letters, nothing is sent."""
    return ProviderError("invalid_request", message)


def to_messages_body(endpoint: str, body: bytes, *, default_max_tokens: int) -> bytes:
    """The Messages request body for a job of ``endpoint`` with ``body`` (JSON bytes).

    Raises a permanent ProviderError for a job that has no faithful Messages equivalent.
    """
    if endpoint == _EMBEDDINGS:
        raise refuse(
            "Anthropic has no embeddings endpoint; run /v1/embeddings lines with "
            "--provider openai (or another provider that has one)"
        )
    if endpoint not in (_CHAT, _COMPLETIONS, _MESSAGES):
        raise refuse(f"{endpoint} has no Anthropic equivalent; use --provider openai")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise refuse("the job's body is not a JSON object")
    if endpoint == _MESSAGES:
        if "max_tokens" in data:
            return body  # already Anthropic's shape: sent byte for byte as queued
        data["max_tokens"] = default_max_tokens
        return orjson.dumps(data)
    return orjson.dumps(_translate(endpoint, data, default_max_tokens))


def _translate(endpoint: str, data: dict[str, Any], default_max_tokens: int) -> dict[str, Any]:
    unknown = sorted(data.keys() - _HANDLED - _NATIVE)
    if unknown:
        raise refuse(
            f"field {unknown[0]!r} has no Anthropic equivalent; remove it, or write the line "
            'in Anthropic\'s own shape ({"custom_id": ..., "params": {...}})'
        )
    if endpoint == _CHAT:
        system, messages = _chat_messages(data.get("messages"))
    else:
        system, messages = None, [{"role": "user", "content": _single_prompt(data.get("prompt"))}]
    out: dict[str, Any] = {"model": data.get("model"), "messages": messages}
    if system is not None:
        out["system"] = system
    out["max_tokens"] = data.get("max_completion_tokens", data.get("max_tokens"))
    if out["max_tokens"] is None:
        out["max_tokens"] = default_max_tokens
    for name in ("temperature", "top_p", *_NATIVE):
        if name in data:
            out[name] = data[name]
    _sampling_options(data, out)
    return out


def _sampling_options(data: dict[str, Any], out: dict[str, Any]) -> None:
    """``n``, ``stream``, ``stop`` and ``user``: carried over, or refused when they cannot be."""
    n = data.get("n", 1)
    if n != 1:
        raise refuse(
            f"n={n}: Anthropic returns one reply per request; remove 'n' (or use --provider "
            "openai for several choices per request)"
        )
    if data.get("stream", False):
        raise refuse("stream=true: aiq does not stream; remove 'stream'")
    stop = data.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if "user" in data:
        metadata = out.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        out["metadata"] = {**metadata, "user_id": data["user"]}


def _single_prompt(prompt: Any) -> Any:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise refuse(
                f"a completions prompt list of {len(prompt)} prompts: Anthropic answers one per "
                "request; give each prompt its own line"
            )
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise refuse("field 'prompt': Anthropic needs text; token-id prompts cannot be sent")
    return prompt


def _chat_messages(messages: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """(system text or None, the user/assistant turns) of OpenAI chat ``messages``."""
    if not isinstance(messages, list):
        raise refuse("field 'messages': expected an array")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            system.append(_system_text(message.get("content"), i))
            continue
        if role not in ("user", "assistant"):
            raise refuse(
                f"messages[{i}]: role {role!r} has no Anthropic equivalent; only system, "
                "user and assistant messages translate"
            )
        extra = sorted(message.keys() - _MESSAGE_KEYS)
        if extra:
            raise refuse(
                f"messages[{i}].{extra[0]}: has no Anthropic equivalent (tool calls and names "
                "do not translate); remove it or write the line in Anthropic's shape"
            )
        turns.append({"role": role, "content": _blocks(message.get("content"), i)})
    if not turns:
        raise refuse("no user or assistant message: Anthropic needs at least one")
    return ("\n\n".join(system) if system else None), turns


def _system_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise refuse(f"messages[{i}].content: a system message must be text")


def _blocks(content: Any, i: int) -> Any:
    """A message's content: a string as it is, OpenAI content parts as Anthropic blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(f"messages[{i}].content: expected a string or an array of parts")
    blocks = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image_block(part.get("image_url"), f"messages[{i}].content[{j}]"))
        else:
            raise refuse(
                f"messages[{i}].content[{j}]: a part of type {kind!r} has no Anthropic "
                "equivalent; only text and image_url parts translate"
            )
    return blocks


def _image_block(image: Any, where: str) -> dict[str, Any]:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise refuse(f"{where}: image_url needs a 'url'")
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        if encoding != "base64" or not data:
            raise refuse(f"{where}: a data: URL image must be base64 (data:TYPE;base64,...)")
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "image", "source": source}
    return {"type": "image", "source": {"type": "url", "url": url}}
