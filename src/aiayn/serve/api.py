"""OpenAI's HTTP API over one checkpoint: ``aiayn serve`` (Starlette on uvicorn).

Endpoints (docs/serving.md has an example of each):

- ``GET /v1/models``: the one model, named by ``--name`` (default: the checkpoint folder's name);
- ``POST /v1/completions`` and ``POST /v1/chat/completions`` (language models): ``max_tokens``, ``temperature``
  (0: greedy), ``top_p``, ``top_k`` (an extra field), ``stop``, ``seed``, ``n``, ``logprobs`` / ``top_logprobs``,
  ``stream`` (server-sent events ending ``data: [DONE]``; ``stream_options.include_usage``); a chat renders the
  checkpoint's chat template (:mod:`aiayn.serve.chat`);
- ``POST /v1/embeddings`` (checkpoints ``aiayn embed`` reads): ``input`` a text or a list of them;
- ``POST /v1/translations`` (translation checkpoints; not OpenAI's): ``input``, ``beam_size``, ``length_penalty``,
  ``n_best``; and ``/v1/completions`` translates its ``prompt``;
- ``GET /health`` and ``GET /metrics`` (Prometheus' text format).

Every error is OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``: a body that is not JSON
of the expected fields 400 (a mistake in the request) or 422 (not JSON: the rules of every aiayn server,
:mod:`aiayn.local_server`), a prompt longer than the model's context 400 naming the limit, a full queue 429 with
``Retry-After``, a missing or wrong API key 401, a request past ``--timeout`` 504. Language-model requests decode in
one continuous batch (:mod:`aiayn.serve.engine`); a client that disconnects stops its decoding at the next step.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiayn.errors import AiaynError
from aiayn.generate.continuous import Continuation
from aiayn.local_server import AllowedHosts, BadRequest, LocalOnly, lone_surrogate, parse_json, read_body
from aiayn.serve import metrics as served_metrics
from aiayn.serve.chat import ChatTemplateError, render
from aiayn.serve.engine import Engine
from aiayn.serve.errors import RequestError
from aiayn.serve.model import ServedModel

EXAMPLE = '{"model": "m", "prompt": "Once upon a time", "max_tokens": 16}'


@dataclass(frozen=True)
class Limits:
    """What the server accepts: body bytes, seconds for a body, seconds for a request's head, seconds per request,
    choices per request (``n`` times prompts), stop strings, top log-probabilities per token."""

    max_body: int = 1 << 20
    body_timeout: float = 10.0
    header_timeout: float = 10.0
    timeout: float = 600.0
    max_choices: int = 64
    max_stops: int = 4
    max_logprobs: int = 20


def openai_error(status: int, message: str, param: str | None = None, **headers: str) -> Any:
    """OpenAI's error object as a JSON response."""
    from starlette.responses import JSONResponse  # optional: starlette

    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status,
                        headers=headers)


# ------------------------------------------------------------------------------------------------ fields
def _fields(body: Any, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object such as {EXAMPLE}")
    missing = sorted(required - set(body))
    if missing:
        raise RequestError(f"missing required field {missing[0]!r}", missing[0])
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}; this server reads {', '.join(sorted(allowed))}",
                           unknown[0])
    return body


def _number(body: dict, name: str, default: float | None, low: float, high: float, whole: bool = False,
            open_low: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return default
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not (low < value if open_low else low <= value) \
            or value > high:
        what = "a whole number" if whole else "a number"
        raise RequestError(f"{name!r} must be {what} {'above' if open_low else 'from'} {low:g} to {high:g}; got "
                           f"{json.dumps(value)[:40]}", name)
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{name!r} must be a string; got {json.dumps(value)[:40]}", name)
    bad = lone_surrogate(value)
    if bad:
        raise RequestError(f"{name!r} holds {bad}, which is not Unicode text", name)
    return value


def _texts(value: Any, name: str, limit: int) -> list[str]:
    """A string or a non-empty list of them."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise RequestError(f"{name!r} must be a string or a non-empty list of strings", name)
    if len(items) > limit:
        raise RequestError(f"{name!r} has {len(items)} items; the most is {limit}", name)
    return [_text(v, name) for v in items]


def _stops(body: dict, limits: Limits) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > limits.max_stops:
        raise RequestError(f"'stop' must be a string or a list of at most {limits.max_stops} strings", "stop")
    stops = [_text(s, "stop") for s in stops]
    if any(not s for s in stops):
        raise RequestError("'stop' strings must not be empty", "stop")
    return stops


SAMPLING = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n",
            "stream", "stream_options", "user", "presence_penalty", "frequency_penalty"}


@dataclass
class Sampling:
    """A request's decoding settings."""

    max_tokens: int | None
    temperature: float
    top_p: float | None
    top_k: int | None
    stops: list[str]
    seed: int | None
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None  # alternatives per token (0: the chosen token's only); None: no log-probabilities


def sampling(body: dict, limits: Limits, logprobs: int | None) -> Sampling:
    """The settings of a completion or chat body."""
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise RequestError(f"{name!r} is not supported by this server; leave it out or 0", name)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise RequestError("'stream_options' may hold only 'include_usage'", "stream_options")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", "stream")
    max_tokens = _number(body, "max_completion_tokens", None, 1, 1 << 20, whole=True)
    max_tokens = _number(body, "max_tokens", max_tokens, 1, 1 << 20, whole=True)
    top_p = _number(body, "top_p", 1.0, 0, 1, open_low=True)
    return Sampling(max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0, 2),
                    top_p=None if top_p == 1 else top_p, top_k=_number(body, "top_k", None, 1, 1 << 20, whole=True),
                    stops=_stops(body, limits), seed=_number(body, "seed", None, 0, 2 ** 63 - 1, whole=True),
                    n=_number(body, "n", 1, 1, limits.max_choices, whole=True), stream=stream,
                    include_usage=bool((options or {}).get("include_usage")), logprobs=logprobs)


# ---------------------------------------------------------------------------------------------- decoding
class Choice:
    """One choice being decoded: its tokens, its text so far and how it ended, fed from the model thread."""

    def __init__(self, served: ServedModel, prompt: list[int], index: int, stops: list[str]) -> None:
        self.served, self.prompt, self.index, self.stops = served, prompt, index, stops
        self.tokens: list[int] = []
        self.logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] = []
        self.text = ""  # the text decided so far (a stop string cut off)
        self.sent = 0  # characters of text already streamed
        self.finish: str | None = None
        self.seq: Continuation | None = None
        self._prompt_text = served.decode(prompt)

    def add(self, token: int, lp: float | None, top: list[tuple[int, float]]) -> bool:
        """Take a token; whether a stop string ended the choice."""
        self.tokens.append(token)
        self.logprobs.append((token, lp, top))
        full = self.served.decode(self.prompt + self.tokens)
        text = full[len(self._prompt_text):] if full.startswith(self._prompt_text) else full
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0:
                self.text, self.finish = text[:at], "stop"
                return True
        self.text = text
        return False

    def ready(self) -> str:
        """The text that can be streamed now: all of it once ended, else all but what could begin a stop string."""
        if self.finish is not None or not self.stops:
            end = len(self.text)
        else:
            hold = max(len(s) for s in self.stops) - 1
            end = max(len(self.text) - hold, self.sent)
        new, self.sent = self.text[self.sent:end], max(end, self.sent)
        return new


async def decode(engine: Engine, served: ServedModel, prompts: list[list[int]], s: Sampling, limits: Limits,
                 disconnected: Callable[[], Any]) -> AsyncIterator[tuple[Choice, str | None]]:
    """Decode ``s.n`` choices of each prompt in the engine's batch: yields (choice, None) as a choice's text grows
    and (choice, finish_reason) when it ends. Cancels every choice left when the consumer stops or the client
    disconnects."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    choices, seqs = [], []
    for p, prompt in enumerate(prompts):
        for k in range(s.n):
            choice = Choice(served, prompt, p * s.n + k, s.stops)
            greedy = s.temperature == 0

            def on_token(token: int, lp: float | None, top: list, c: Choice = choice) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (c, "token", (token, lp, top)))

            def on_end(reason: str, c: Choice = choice) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (c, "end", reason))
            seq = Continuation(prompt, s.max_tokens, served.stop_ids, greedy, s.temperature or 1.0, s.top_k, s.top_p,
                               None if s.seed is None else s.seed + k, s.logprobs, on_token, on_end)
            choice.seq = seq
            choices.append(choice)
            seqs.append(seq)
    if not engine.submit(seqs):
        raise RequestError(f"the server's queue is full ({engine.max_queue} sequences waiting); retry shortly",
                           status=429)
    served_metrics.QUEUED.set(engine.queued)
    open_choices = set(range(len(choices)))
    deadline = loop.time() + limits.timeout
    try:
        while open_choices:
            try:
                choice, kind, value = await asyncio.wait_for(events.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await disconnected():
                    return
                if loop.time() > deadline:
                    raise RequestError(f"the request ran past the server's {limits.timeout:g} s", status=504) from None
                continue
            if choice.index not in open_choices:
                continue
            if kind == "token":
                if choice.add(*value):
                    engine.cancel([choice.seq])
                    open_choices.discard(choice.index)
                    yield choice, "stop"
                else:
                    yield choice, None
            else:
                open_choices.discard(choice.index)
                if value == "error":
                    raise RequestError("the model failed while decoding this request; see the server's log",
                                       status=500)
                choice.finish = choice.finish or ("length" if value == "length" else "stop")
                yield choice, choice.finish
    finally:
        left = [choices[i].seq for i in open_choices]
        if left:
            engine.cancel(left)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def logprobs_entry(served: ServedModel, entries: list[tuple[int, float | None, list[tuple[int, float]]]],
                   chat: bool) -> Any:
    """Tokens' log-probabilities ([(token, logprob, [(alternative, logprob), ...]), ...]) in OpenAI's form: the
    completions API's four lists, or the chat API's content entries."""
    text = served.token_text
    if chat:
        return {"content": [{"token": text(t), "logprob": lp, "bytes": list(text(t).encode()),
                             "top_logprobs": [{"token": text(a), "logprob": v, "bytes": list(text(a).encode())}
                                              for a, v in top]}
                            for t, lp, top in entries]}
    offsets, at = [], 0
    for t, _, _ in entries:
        offsets.append(at)
        at += len(text(t))
    return {"tokens": [text(t) for t, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [{text(a): v for a, v in top} for _, _, top in entries], "text_offset": offsets}


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """A chat body's ``messages`` as [{"role", "content"}, ...] of plain text (text parts joined)."""
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {\"role\": ..., \"content\": ...}", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
        content = m["content"]
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(_text(p.get("text"), "messages") for p in content)
        clean.append({"role": m["role"], "content": _text(content, "messages")})
    return clean


def embedding_values(vectors: Any, encoding: str) -> list[Any]:
    """(N, D) vectors as OpenAI sends them: lists of floats, or base64 of little-endian float32."""
    if encoding == "base64":
        return [base64.b64encode(v.numpy().astype("<f4").tobytes()).decode() for v in vectors]
    return vectors.tolist()


@dataclass
class Completion:
    """One completion or chat request being answered: its ids, prompts and settings, and its time to first token
    observed per choice."""

    served: ServedModel
    prompts: list[list[int]]
    s: Sampling
    chat: bool

    def __post_init__(self) -> None:
        self.kind = "chat.completion" if self.chat else "text_completion"
        self.id, self.created = new_id("chatcmpl" if self.chat else "cmpl"), int(time.time())
        self.started, self._seen = time.monotonic(), set()
        self.usage = {"prompt_tokens": sum(len(p) for p in self.prompts) * self.s.n}
        self.choices = len(self.prompts) * self.s.n

    def observe(self, choice: Choice) -> None:
        if choice.index not in self._seen:
            self._seen.add(choice.index)
            served_metrics.TTFT.observe(time.monotonic() - self.started)

    def with_completion(self, tokens: int) -> dict[str, int]:
        return {**self.usage, "completion_tokens": tokens, "total_tokens": self.usage["prompt_tokens"] + tokens}

    def answer(self, done: dict[int, Choice]) -> dict[str, Any]:
        """The whole answer of a request that does not stream."""
        out = []
        for i in sorted(done):
            c = done[i]
            lp = logprobs_entry(self.served, c.logprobs, self.chat) if self.s.logprobs is not None else None
            item: dict[str, Any] = {"index": i, "finish_reason": c.finish, "logprobs": lp}
            item.update({"message": {"role": "assistant", "content": c.text}} if self.chat else {"text": c.text})
            out.append(item)
        tokens = sum(len(c.tokens) for c in done.values())
        served_metrics.TOKENS.inc(tokens)
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.served.name,
                "choices": out, "usage": self.with_completion(tokens)}

    def chunk(self, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        """One server-sent event."""
        payload = {"id": self.id, "object": self.kind + ".chunk" if self.chat else self.kind, "created": self.created,
                   "model": self.served.name, "choices": choices, **(extra or {})}
        return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"

    def delta(self, choice: Choice, finish: str | None) -> dict[str, Any] | None:
        """A choice's streamed piece: the text that can be sent now (and its last token's log-probabilities), or
        None when there is nothing to send."""
        new = choice.ready()
        if not new and finish is None:
            return None
        lp = None
        if self.s.logprobs is not None and finish is None and choice.logprobs:
            lp = logprobs_entry(self.served, choice.logprobs[-1:], self.chat)
        if self.chat:
            return {"index": choice.index, "delta": {"content": new} if new else {}, "logprobs": lp,
                    "finish_reason": finish}
        return {"index": choice.index, "text": new, "logprobs": lp, "finish_reason": finish}


class Endpoints:
    """The server's handlers over one model and its engine (see the module docstring)."""

    def __init__(self, served: ServedModel, engine: Engine, limits: Limits, api_key: str | None) -> None:
        self.served, self.engine, self.limits, self.api_key = served, engine, limits, api_key

    # ------------------------------------------------------------------------------------------- framing
    def authorized(self, request: Any) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def guarded(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``handler`` behind the API key, its mistakes answered as OpenAI's error objects."""
        async def endpoint(request: Any) -> Any:
            if not self.authorized(request):
                return openai_error(401, "missing or wrong API key: send 'Authorization: Bearer KEY' with the key "
                                         "the server was started with (--api-key or AIAYN_API_KEY)")
            try:
                return await handler(request)
            except BadRequest as e:
                extra = {"Retry-After": "1"} if e.status == 429 else {}
                return openai_error(e.status, e.message, getattr(e, "param", None), **extra)
            except (AiaynError, ChatTemplateError) as e:
                return openai_error(400, str(e))
        return endpoint

    async def body(self, request: Any, allowed: set[str], required: set[str]) -> dict[str, Any]:
        """The request's JSON body, its fields checked, naming this model or none."""
        raw = await read_body(request, self.limits.max_body, self.limits.body_timeout)
        body = _fields(parse_json(raw, EXAMPLE), allowed, required)
        name = body.get("model")
        if name is not None and name != self.served.name:
            raise RequestError(f"model {json.dumps(name)[:60]} is not served here; this server serves "
                               f"{self.served.name!r}", "model", status=404)
        return body

    def prompt_ids(self, texts: list[str], max_tokens: int | None, param: str) -> tuple[list[list[int]], int]:
        """The prompts' ids and the tokens each may add, checked against the model's context."""
        ids = [self.served.encode(t) for t in texts]
        longest = max(len(i) for i in ids)
        room = self.served.context - longest
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = f" + max_tokens {max_tokens}" if max_tokens is not None else ""
            raise RequestError(f"this model's context holds {self.served.context} tokens; the prompt has {longest}"
                               f"{asked}: shorten the prompt or lower max_tokens", param)
        return ids, max_tokens or room

    # ---------------------------------------------------------------------------------------- endpoints
    async def models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse  # optional: starlette

        return JSONResponse({"object": "list", "data": [self.served.card()]})

    async def health(self, request: Any) -> Any:
        from starlette.responses import JSONResponse  # optional: starlette

        return JSONResponse({"status": "ok", "model": self.served.name, "running": self.engine.running,
                             "queued": self.engine.queued})

    async def metrics(self, request: Any) -> Any:
        from starlette.responses import Response  # optional: starlette

        served_metrics.QUEUED.set(self.engine.queued)
        served_metrics.RUNNING.set(self.engine.running)
        body, content_type = served_metrics.exposition()
        return Response(body, media_type=content_type)

    async def completions(self, request: Any) -> Any:
        body = await self.body(request, SAMPLING | {"prompt", "logprobs", "echo", "suffix", "best_of"}, {"prompt"})
        for name in ("echo", "suffix", "best_of"):
            if body.get(name) not in (None, False, 1) or (name == "suffix" and body.get(name)):
                raise RequestError(f"{name!r} is not supported by this server; leave it out", name)
        texts = _texts(body["prompt"], "prompt", self.limits.max_choices)
        if self.served.kind == "translation":
            return await self.translate(body, texts, completion=True)
        self.served.require("lm", "/v1/completions")
        s = sampling(body, self.limits, _number(body, "logprobs", None, 0, self.limits.max_logprobs, whole=True))
        if len(texts) * s.n > self.limits.max_choices:
            raise RequestError(f"{len(texts)} prompts x n={s.n} choices; the most is {self.limits.max_choices}", "n")
        ids, s.max_tokens = self.prompt_ids(texts, s.max_tokens or 16, "prompt")
        return await self.complete(request, Completion(self.served, ids, s, chat=False))

    async def chat_completions(self, request: Any) -> Any:
        body = await self.body(request, SAMPLING | {"messages", "logprobs", "top_logprobs"}, {"messages"})
        self.served.require("lm", "/v1/chat/completions")
        if self.served.chat_template is None:
            raise RequestError(f"{self.served.name} has no chat template (its checkpoint records none: a model "
                               "converted from a transformers folder whose tokenizer_config.json has a "
                               "'chat_template' has one); use /v1/completions with a prompt instead", "messages")
        messages = chat_messages(body)
        wants = body.get("logprobs", False)
        if not isinstance(wants, bool):
            raise RequestError("'logprobs' must be true or false", "logprobs")
        top = _number(body, "top_logprobs", 0, 0, self.limits.max_logprobs, whole=True)
        s = sampling(body, self.limits, top if wants else None)
        prompt = render(self.served.chat_template, messages, self.served.bos_token, self.served.eos_token)
        ids, s.max_tokens = self.prompt_ids([prompt], s.max_tokens, "messages")
        return await self.complete(request, Completion(self.served, ids, s, chat=True))

    async def complete(self, request: Any, c: Completion) -> Any:
        """Decode a completion or chat request: one answer, or server-sent events as its text grows."""
        from starlette.responses import JSONResponse, Response, StreamingResponse  # optional: starlette

        served_metrics.REQUESTS.labels(endpoint="chat" if c.chat else "completions").inc()
        decoding = decode(self.engine, self.served, c.prompts, c.s, self.limits, request.is_disconnected)
        if not c.s.stream:
            done: dict[int, Choice] = {}
            async for choice, finish in decoding:
                c.observe(choice)
                if finish is not None:
                    done[choice.index] = choice
            if len(done) < c.choices:  # the client left
                return Response(status_code=499)
            return JSONResponse(c.answer(done))

        async def events() -> AsyncIterator[bytes]:
            if c.chat:
                yield c.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                               for i in range(c.choices)])
            tokens = 0
            async for choice, finish in decoding:
                c.observe(choice)
                if finish is not None:
                    tokens += len(choice.tokens)
                item = c.delta(choice, finish)
                if item is not None:
                    yield c.chunk([item])
            served_metrics.TOKENS.inc(tokens)
            if c.s.include_usage:
                yield c.chunk([], {"usage": c.with_completion(tokens)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def embeddings(self, request: Any) -> Any:
        from starlette.responses import JSONResponse  # optional: starlette

        body = await self.body(request, {"model", "input", "encoding_format", "dimensions", "user"}, {"input"})
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise RequestError("'encoding_format' must be \"float\" or \"base64\"", "encoding_format")
        texts = _texts(body["input"], "input", 2048)
        served_metrics.REQUESTS.labels(endpoint="embeddings").inc()
        vectors, tokens = await asyncio.wrap_future(self.served.embed(self.engine, texts))
        if body.get("dimensions") not in (None, vectors.shape[1]):
            raise RequestError(f"'dimensions': this model's embeddings have {vectors.shape[1]}", "dimensions")
        data = [{"object": "embedding", "index": i, "embedding": v}
                for i, v in enumerate(embedding_values(vectors, encoding))]
        return JSONResponse({"object": "list", "data": data, "model": self.served.name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def translations(self, request: Any) -> Any:
        body = await self.body(request, {"model", "input", "beam_size", "length_penalty", "n_best"}, {"input"})
        return await self.translate(body, _texts(body["input"], "input", 1024))

    async def translate(self, body: dict[str, Any], texts: list[str], completion: bool = False) -> Any:
        """Beam-search ``texts``: ``/v1/translations``' answer, or ``/v1/completions``' for a translation model."""
        from starlette.responses import JSONResponse  # optional: starlette

        self.served.require("translation", "/v1/translations")
        beam = _number(body, "beam_size", None, 1, 64, whole=True)
        alpha = _number(body, "length_penalty", None, 0, 10)
        n_best = 1 if completion else _number(body, "n_best", 1, 1, 64, whole=True)
        served_metrics.REQUESTS.labels(endpoint="translations").inc()
        outs = await asyncio.wrap_future(self.served.translate(self.engine, texts, beam, alpha, n_best))
        if completion:
            return JSONResponse({"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                                 "model": self.served.name,
                                 "choices": [{"index": i, "text": o, "logprobs": None, "finish_reason": "stop"}
                                             for i, o in enumerate(outs)]})
        return JSONResponse({"object": "list", "model": self.served.name,
                             "data": [{"index": i, "translations": o if isinstance(o, list) else [o]}
                                      for i, o in enumerate(outs)]})


async def _http_error(request: Any, exc: Exception) -> Any:
    status = getattr(exc, "status_code", 500)
    message = {404: f"no such endpoint: {request.method} {request.url.path}; see GET /v1/models",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(status, str(exc))
    return openai_error(status, message)


# ------------------------------------------------------------------------------------------------ the app
def build_app(served: ServedModel, engine: Engine, limits: Limits = Limits(), host: str = "127.0.0.1",
              api_key: str | None = None, also: tuple[str, ...] = ()) -> Any:
    """The server's ASGI application (Starlette), behind :class:`aiayn.local_server.LocalOnly`."""
    from starlette.applications import Starlette  # optional: starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    e = Endpoints(served, engine, limits, api_key)
    routes = [Route("/v1/models", e.guarded(e.models), methods=["GET"]),
              Route("/health", e.health, methods=["GET"]),
              Route("/metrics", e.metrics, methods=["GET"]),
              Route("/v1/completions", e.guarded(e.completions), methods=["POST"]),
              Route("/v1/chat/completions", e.guarded(e.chat_completions), methods=["POST"]),
              Route("/v1/embeddings", e.guarded(e.embeddings), methods=["POST"]),
              Route("/v1/translations", e.guarded(e.translations), methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    return LocalOnly(app, AllowedHosts.bound_to(host, *also), openai_error, pages=())
