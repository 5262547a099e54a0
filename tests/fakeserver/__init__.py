"""A real OpenAI-compatible HTTP server on 127.0.0.1 that enforces rate limits and injects faults.

From a sync pytest test::

    with FakeServer(transient_rate=0.2) as server:
        run_aiq("--base-url", server.base_url, ...)
        assert server.count_for("hello") == 1

As a process, for benchmarks (prints ``READY <port>`` once it listens, serves until killed)::

    python tests/fakeserver --port 0 --latency 0 [--rpm 6000 --limit-window 1 ...]

The package, one job a module: ``replies`` (the 200 replies of each API, and how a request's
text and tokens are read), ``anthropic`` (the Messages API's dialect), ``batches`` (OpenAI's
Files and Batches API), ``message_batches`` (Anthropic's Message Batches), ``limits`` (the
server's own sliding-window limiter), ``modes`` (rate limits as a given provider counts them, each
citing its source), ``faults`` (refusals, rejects and per-attempt faults), ``exchange`` (a
request while it is decided, and as it is logged), ``server`` (``FakeServer``), ``cli``.

It deliberately imports nothing from ``aiq``: it is the oracle aiq is tested against, so a bug in
aiq's own reply builders (``aiq.providers.simulated``) must not be able to agree with itself here.
``tests/test_fakeserver.py`` pins both to the same truth, the official ``openai`` response types.

It also serves Anthropic's Messages API at ``POST /v1/messages`` (``anthropic.py``),
with every knob below: its auth is ``x-api-key``, its errors, request id and rate-limit headers
are Anthropic's, and an overload (``error_503_rate``, an outage) is its 529 ``overloaded_error``.

Behaviour knobs are plain attributes, read on every request, so a test may change them while the
server runs (e.g. set ``reject_marker = None`` and replay the dead letters). With every knob at its
default the server answers every well-formed request 200 at once.

Refusals, whatever the request says:

- ``outage_until`` (a ``time.monotonic()`` value; or call ``start_outage(seconds)``): until then
  every request, ``/v1/models`` too, gets 503 (or, with ``outage_fault="reset"``, a reset). The
  provider is down, so these count against no rate limit.
- ``require_key``: 401 unless ``Authorization: Bearer <require_key>`` (``x-api-key:
  <require_key>`` on ``/v1/messages``).
- ``status_for_all``: answer every request with this status and OpenAI's error body for it
  (401 bad key, 403, 404 unknown model, 429 quota, 500, 503).
- ``status_for_model``: ``{model: status}``: answer every request naming that model with this
  status (and the dialect's error body), after any latency; other models are served as usual.
  A gateway in front of several deployments (LiteLLM's router, OpenRouter, a vLLM per model
  behind one URL) fails this way when one model's deployment is down: its calls get 500s while
  the others' succeed on the same endpoint (PROVIDERS.md: "an always-failing model").

Rate limits, as OpenAI enforces them (``limits.py``):

- ``rpm``, ``tpm``: requests and tokens per minute (None: unlimited). A request costs its prompt
  tokens, estimated as the reply's ``usage`` counts them, plus ``max_completion_tokens`` (or
  ``max_tokens``) times ``n``: :func:`request_tokens`. One over the limit gets 429 with OpenAI's
  message and ``retry-after`` / ``retry-after-ms``, and is not counted. Every reply to a POST
  carries the ``x-ratelimit-*`` headers of the limits that are set (none when none are).
- ``limit_window_s``: 60 enforces per minute; 1 enforces ``rpm / 60`` and ``tpm / 60`` per second,
  as providers may (choose limits divisible by 60 then). The window slides: no span of
  ``limit_window_s`` seconds ever admits more than the limit.

Rate limits as a given provider or gateway counts them (``modes/``):

- ``limit_mode``: a ``modes.Mode`` (OpenAI's bucket, per-second enforcement, LiteLLM's
  calendar minutes, Azure's 10-second windows, Groq's per-day requests, Anthropic's buckets, no
  headers at all, another client on the key). It admits or refuses each request with that
  provider's 429 and writes its headers, in place of ``rpm`` / ``tpm`` (which must then be
  unset). ``limit_clock`` is its clock (``time.time``; a test may pass a fake one). A mode with
  ``slots`` serves that many requests at once (their ``latency_s``); the rest queue.
  ``max_in_flight`` is the most requests held at once so far, queued or served (counted while
  ``latency_s`` or ``slots`` is set).

Faults, for the requests the limiter admitted:

- ``reject_marker``: a request whose text contains it gets a permanent 400.
- ``cut_off_marker``, ``thinking_marker``, ``filter_marker``: a request whose text contains one
  gets a 200 that stopped short, in the shape of its API (:func:`stopped_short`): cut off at
  ``max_tokens`` (chat and completions ``finish_reason: "length"``, Responses ``status:
  "incomplete"`` for ``max_output_tokens``, Anthropic ``stop_reason: "max_tokens"``); a
  reasoning model's whole budget spent thinking (the same, with empty content and every
  completion token a reasoning token); stopped by a content filter (``"content_filter"``,
  Anthropic's ``"refusal"``). Billed as providers bill them: the tokens generated.
- ``reject_rate``: the share of prompts that always get a permanent 400 (drawn from the seed and
  the prompt, so a retry gets it again; :meth:`FakeServer.would_reject` tells which).
- ``transient_rate``: the share of attempts answered 500 or 429 (+ ``retry-after`` from
  ``retry_after_s``; this 429 does not come from the limiter).
- ``error_500_rate``, ``error_503_rate``: the share answered 500 / 503 with OpenAI's bodies.
- ``reset_rate``: the share whose TCP connection is reset, without a byte of reply.
- ``hang_rate``: the share answered only after ``hang_s`` more seconds (past a client's timeout).
- ``malformed_rate``: the share answered 200 with a body cut off mid-JSON, or a JSON object that
  lacks ``choices`` (``data`` for embeddings).

The per-attempt shares are slices of one draw, in that order, so they exclude one another and add
up: ``error_500_rate=0.05, reset_rate=0.02`` fails 7% of attempts. The draw hashes the seed, the
request body and how often that body reached this point before, so a run is reproducible and a
retried request gets a fresh draw.

Usage, as the providers report it (the usage objects of OpenAI's Chat Completions and
Responses API references and Anthropic's Messages API reference; ../shared/PROVIDERS.md):

- ``cached_tokens``: this many of each prompt's tokens (at most all of them) were read from
  OpenAI's prompt cache: ``usage.prompt_tokens_details.cached_tokens`` (Responses:
  ``input_tokens_details``), still counted in ``prompt_tokens``, billed at the cached-input
  price. (OpenAI caches prompts of 1,024 tokens or more, in steps of 128; a fixed figure keeps
  a test's arithmetic plain.) Anthropic's prompt cache is emulated from ``cache_control``
  marks instead (``anthropic.account_cache``): ``cache_creation_input_tokens`` on the
  first request with a marked prefix, ``cache_read_input_tokens`` after, both left out of
  ``input_tokens``.
- ``reasoning_tokens``: each chat, responses or Anthropic reply spent this many tokens
  reasoning before its text: added to ``completion_tokens`` (``output_tokens``) and reported
  in ``completion_tokens_details.reasoning_tokens`` (Responses: ``output_tokens_details``;
  Anthropic: ``output_tokens_details.thinking_tokens``), billed as output, not in the text.
- ``usage_patches``: ``{marker: {field: value}}``; a reply whose request text holds a marker
  has those fields of its ``usage`` set to those values, whatever they are (a negative count,
  a float, a string, null: a broken or hostile server; ``""`` marks every request).

- ``chat_template``: ``(per_message, per_request)`` tokens a chat template adds to each chat
  completion's ``prompt_tokens``, as a real server counts the prompt it formats, not only its
  text; None: the text alone. ``GEMMA3_TEMPLATE`` is Gemma 3's under llama.cpp: ``<bos>`` once,
  ``<start_of_turn>user\n … <end_of_turn>\n`` around each message (5 tokens) and the reply
  primed with ``<start_of_turn>model\n`` (3): 9 for one message, as the issue measured
  (Google's "Gemma formatting and system instructions", ai.google.dev/gemma/docs/core/
  prompt-structure; its control tokens are single tokens in the tokenizer). OpenAI's cookbook
  counts 3 and 3 for its chat models ("How to count tokens with tiktoken",
  openai/openai-cookbook examples/How_to_count_tokens_with_tiktoken.ipynb).
- ``reply_tokens``: an Anthropic reply's text is this many tokens long (cut off at the
  request's ``max_tokens``, ``stop_reason: "max_tokens"``), for output-token limits; None: a
  short sentence.
- ``latency_s``: seconds slept before answering (no sleep at all when 0, for throughput). Outages
  and rate-limit 429s are answered at once, as a gateway in front of the model would.
- ``max_parallel``: serve that many requests at once and queue the rest, as a llama.cpp server
  with that many slots does (set at start).
- ``record``: keep the request log (``requests``); off for benchmarks.
"""

from .exchange import Fault, LoggedRequest, _Exchange
from .limits import openai_429
from .modes import openai_duration
from .replies import (
    EMBEDDING_DIM,
    GEMMA3_TEMPLATE,
    MODEL,
    OPENAI_TEMPLATE,
    Stop,
    chat_reply,
    completion_reply,
    embedding_reply,
    error_body,
    malformed_body,
    message_reply,
    prompt_of,
    reply_text,
    request_tokens,
    responses_reply,
    stopped_short,
)
from .server import FakeServer

__all__ = [
    "EMBEDDING_DIM",
    "GEMMA3_TEMPLATE",
    "MODEL",
    "OPENAI_TEMPLATE",
    "FakeServer",
    "Fault",
    "LoggedRequest",
    "Stop",
    "_Exchange",
    "chat_reply",
    "completion_reply",
    "embedding_reply",
    "error_body",
    "malformed_body",
    "message_reply",
    "openai_429",
    "openai_duration",
    "prompt_of",
    "reply_text",
    "request_tokens",
    "responses_reply",
    "stopped_short",
]
