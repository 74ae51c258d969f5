"""``aiayn serve`` through the real ``openai`` client and raw HTTP: every endpoint, streaming, exactness against
``aiayn generate`` / ``translate`` / ``embed`` for requests decoded together, bad bodies, limits and keys."""

from __future__ import annotations

import concurrent.futures
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.generate import generate  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402
from aiayn.serve.api import Limits, build_app  # noqa: E402
from aiayn.serve.model import ServedModel  # noqa: E402
from aiayn.serve.server import start_engine  # noqa: E402
from aiayn.tasks.embedding import embed  # noqa: E402
from aiayn.tasks.translation import translate_texts  # noqa: E402
from aiayn.tokenize import WordTokenizer  # noqa: E402
from aiayn.tokenize.text_codec import codec_from_meta  # noqa: E402

TEXT = ["the small dog runs .", "a red bird sings over the house .", "the cat sleeps near the river ,",
        "user : hello there . assistant : hi !", "system : be brief ."]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant :{% endif %}")


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word-level language model with large random weights (varied continuations) and a chat template."""
    tok = WordTokenizer.train(TEXT)
    config = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                         max_len=64, dropout=0.0, position="rope", norm_position="pre", tie_embeddings=False)
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5)
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": 48,
            "newline_symbol": None, "packing": False, "chat_template": TEMPLATE}
    return save_checkpoint(tmp_path_factory.mktemp("serve") / "tiny-lm", model, meta,
                           tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))


@pytest.fixture(scope="module")
def lm(lm_checkpoint: Path):
    pre = load_pretrained(lm_checkpoint)
    served = ServedModel(pre, "tiny-lm")
    engine = start_engine(served, max_batch=8, max_queue=64, prefill_chunk=16)
    yield pre, served, engine
    engine.stop()


@pytest.fixture
def lm_url(lm, serve):
    pre, served, engine = lm
    with serve(build_app(served, engine, Limits(timeout=60))) as url:
        yield url


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def alone(pre, prompt: str, max_tokens: int, **kw) -> str:
    """What ``aiayn generate`` gives for the prompt alone (its codec, EOS, padding), as text."""
    codec = codec_from_meta(pre.tokenizers["text"], pre.meta)
    tok = codec.tokenizer
    ids = codec.encode(prompt) if prompt else codec.start_ids()
    out = generate(pre.model, [ids], max_new_tokens=max_tokens, stop_ids=(tok.eos_id,), pad_id=tok.pad_id, **kw)[0]
    return codec.decode(ids + out)[len(codec.decode(ids)):]


def test_models_and_health(lm_url: str) -> None:
    models = client(lm_url).models.list()
    assert [m.id for m in models.data] == ["tiny-lm"]
    health = httpx.get(lm_url + "/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny-lm"


def test_a_greedy_completion_is_what_generate_gives_alone(lm, lm_url: str) -> None:
    pre = lm[0]
    got = client(lm_url).completions.create(model="tiny-lm", prompt="the small dog", max_tokens=7, temperature=0)
    assert got.choices[0].text == alone(pre, "the small dog", 7, greedy=True)
    assert got.choices[0].finish_reason in ("length", "stop") and got.usage.prompt_tokens == 3
    assert got.usage.completion_tokens <= 7 and got.object == "text_completion"


def test_concurrent_mixed_requests_each_equal_the_request_alone(lm, lm_url: str) -> None:
    """1-32 clients at once, greedy and seeded sampling mixed, mixed prompt and output lengths."""
    pre = lm[0]
    rng = random.Random(0)
    words = " ".join(TEXT).split()
    jobs = []
    for i in range(32):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 9)))
        greedy = i % 3 != 0
        jobs.append(dict(prompt=prompt, max_tokens=rng.randrange(1, 12), temperature=0 if greedy else 0.8,
                         seed=None if greedy else i))
    c = client(lm_url)

    def ask(job: dict) -> str:
        return c.completions.create(model="tiny-lm", **job).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, jobs))
    for job, answer in zip(jobs, answers):
        kw = dict(greedy=True) if job["temperature"] == 0 else dict(temperature=0.8, seed=job["seed"])
        assert answer == alone(pre, job["prompt"], job["max_tokens"], **kw), job


def test_streaming_gives_the_same_text_token_by_token_and_ends_with_done(lm, lm_url: str) -> None:
    pre = lm[0]
    pieces = [ch.choices[0].text for ch in client(lm_url).completions.create(
        model="tiny-lm", prompt="a red bird", max_tokens=8, temperature=0, stream=True) if ch.choices]
    assert "".join(pieces) == alone(pre, "a red bird", 8, greedy=True) and len(pieces) >= 2
    with httpx.stream("POST", lm_url + "/v1/completions", json={"prompt": "a red", "max_tokens": 3,
                                                                 "stream": True, "temperature": 0}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"


def test_chat_renders_the_template_and_streams(lm, lm_url: str) -> None:
    pre = lm[0]
    c = client(lm_url)
    messages = [{"role": "system", "content": "be brief ."}, {"role": "user", "content": "hello there ."}]
    got = c.chat.completions.create(model="tiny-lm", messages=messages, max_tokens=6, temperature=0)
    prompt = "system : be brief . user : hello there . assistant :"
    assert got.choices[0].message.content == alone(pre, prompt, 6, greedy=True)
    assert got.choices[0].message.role == "assistant" and got.object == "chat.completion"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny-lm", messages=messages, max_tokens=6, temperature=0, stream=True) if ch.choices)
    assert streamed == got.choices[0].message.content


def test_n_stop_and_logprobs_behave_as_in_the_openai_api(lm, lm_url: str) -> None:
    pre = lm[0]
    c = client(lm_url)
    got = c.completions.create(model="tiny-lm", prompt="the cat", max_tokens=6, temperature=0.9, seed=3, n=3)
    assert sorted(ch.index for ch in got.choices) == [0, 1, 2]
    for k, ch in enumerate(got.choices):
        assert ch.text == alone(pre, "the cat", 6, temperature=0.9, seed=3 + k)
    full = alone(pre, "the cat", 10, greedy=True)
    words = full.split()
    if len(words) >= 3:
        stop = " " + words[2]
        cut = c.completions.create(model="tiny-lm", prompt="the cat", max_tokens=10, temperature=0, stop=[stop])
        assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    lp = c.completions.create(model="tiny-lm", prompt="the cat", max_tokens=4, temperature=0, logprobs=2)
    entry = lp.choices[0].logprobs
    assert len(entry.tokens) == len(entry.token_logprobs) == len(entry.top_logprobs) >= 1
    assert all(v <= 0 for v in entry.token_logprobs) and all(len(t) == 2 for t in entry.top_logprobs)
    chat = c.chat.completions.create(model="tiny-lm", messages=[{"role": "user", "content": "hello"}],
                                     max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)


def test_bad_requests_are_openai_errors(lm_url: str) -> None:
    c = client(lm_url)
    with pytest.raises(openai.BadRequestError, match="context holds 48 tokens"):
        c.completions.create(model="tiny-lm", prompt="the dog " * 30, max_tokens=5)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.completions.create(model="gpt-4", prompt="the", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="'temperature' must be a number from 0 to 2"):
        c.completions.create(model="tiny-lm", prompt="the", max_tokens=2, temperature=3)
    cases = [(b"{", 422, "not JSON"), (b"[]", 400, "JSON object"), (b'{"prompt": 1}', 400, "'prompt'"),
             (b'{"prompt": "a", "max_tokens": 0}', 400, "'max_tokens'"),
             (b'{"prompt": "a", "frobnicate": 1}', 400, "unknown field 'frobnicate'"),
             (b'{"messages": []}', 400, "'messages'"), (b"\xff", 422, "not UTF-8")]
    for body, status, message in cases:
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        r = httpx.post(lm_url + path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (body, r.text)
        assert message in r.json()["error"]["message"], (body, r.text)
    r = httpx.post(lm_url + "/v1/completions", content=b'{"prompt": "a"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = httpx.get(lm_url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.get(lm_url + "/v1/models", headers={"host": "evil.example"})
    assert r.status_code == 400
    r = httpx.post(lm_url + "/v1/embeddings", json={"input": "the dog"})
    assert r.status_code == 200  # a language model's pooled states, as aiayn embed gives them


def test_metrics_count_requests_and_tokens(lm_url: str) -> None:
    client(lm_url).completions.create(model="tiny-lm", prompt="the", max_tokens=3, temperature=0)
    text = httpx.get(lm_url + "/metrics").text
    for name in ("aiayn_requests_total", "aiayn_generated_tokens_total", "aiayn_queued_sequences",
                 "aiayn_batch_rows_bucket", "aiayn_time_to_first_token_seconds_bucket"):
        assert name in text


def test_an_api_key_is_required_when_set(lm, serve) -> None:
    pre, served, engine = lm
    with serve(build_app(served, engine, api_key="s3cret")) as url:
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        assert [m.id for m in client(url, "s3cret").models.list().data] == ["tiny-lm"]
        assert httpx.get(url + "/health").status_code == 200


def test_a_client_that_disconnects_frees_its_row(lm, lm_url: str) -> None:
    engine = lm[2]
    with httpx.stream("POST", lm_url + "/v1/completions", json={"prompt": "the", "max_tokens": 40,
                                                                 "stream": True, "temperature": 0.8}) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.running == 0


def test_a_full_queue_is_429_with_retry_after(lm_checkpoint: Path, serve) -> None:
    pre = load_pretrained(lm_checkpoint)
    served = ServedModel(pre, "tiny-lm")
    engine = start_engine(served, max_batch=1, max_queue=1, prefill_chunk=16)
    try:
        with serve(build_app(served, engine)) as url:
            r = httpx.post(url + "/v1/completions", json={"prompt": "the", "max_tokens": 3, "n": 2})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
    finally:
        engine.stop()


def test_translations_and_embeddings_equal_the_commands(inspect_checkpoints, serve) -> None:
    pre = load_pretrained(inspect_checkpoints["translation"])
    served = ServedModel(pre, "mt")
    engine = start_engine(served, 8, 64, 16)
    texts = ["the small dog runs .", "a red bird sings", ""]
    try:
        with serve(build_app(served, engine)) as url:
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(lambda t: httpx.post(url + "/v1/translations", json={"input": [t]}).json(),
                                        texts))
            src, tgt = pre.tokenizers["src"], pre.tokenizers["tgt"]
            want = translate_texts(pre.model, src, tgt, texts[:2], beam=2, alpha=0.6, max_len_a=1.0, max_len_b=6)
            assert [a["data"][0]["translations"][0] for a in answers] == [*want, ""]
            n = httpx.post(url + "/v1/translations", json={"input": texts[0], "n_best": 2}).json()
            assert len(n["data"][0]["translations"]) == 2
            done = client(url).completions.create(model="mt", prompt=texts[0], max_tokens=16)
            assert done.choices[0].text == want[0]
    finally:
        engine.stop()
    pre = load_pretrained(inspect_checkpoints["classification"])
    served = ServedModel(pre, "enc")
    engine = start_engine(served, 8, 64, 16)
    try:
        with serve(build_app(served, engine)) as url:
            got = client(url).embeddings.create(model="enc", input=["the small dog", "a red bird sings"])
            want = embed(pre, ["the small dog", "a red bird sings"])
            assert torch.allclose(torch.tensor([d.embedding for d in got.data]), want, atol=1e-6)
            r = httpx.post(url + "/v1/completions", json={"prompt": "the", "max_tokens": 2})
            assert r.status_code == 400 and "needs a lm model" in r.json()["error"]["message"]
    finally:
        engine.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_command_serves_drains_on_sigterm_and_refuses_a_busy_port(lm_checkpoint: Path) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(lm_checkpoint), "--port", str(port),
           "--grace", "20"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert f"127.0.0.1:{port}" in line, line
        url = f"http://127.0.0.1:{port}"
        with httpx.stream("POST", url + "/v1/completions", json={"prompt": "the", "max_tokens": 30, "stream": True,
                                                                  "temperature": 0.8}, timeout=60) as r:
            busy = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert busy.returncode == 2 and "already in use" in busy.stderr
            assert len(busy.stderr.strip().splitlines()) == 1
            proc.send_signal(15)  # SIGTERM mid-stream: the stream finishes, then the server exits 0
            lines = [ln for ln in r.iter_lines() if ln]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_chat_without_a_template_is_a_400_naming_it(lm, serve) -> None:
    pre, _, engine = lm
    served = ServedModel(pre, "tiny-lm")
    served.chat_template = None
    with serve(build_app(served, engine)) as url:
        with pytest.raises(openai.BadRequestError, match="has no chat template"):
            client(url).chat.completions.create(model="tiny-lm", messages=[{"role": "user", "content": "hi"}])


def test_a_chat_template_runs_sandboxed_and_a_converted_folder_keeps_its_template(tmp_path: Path) -> None:
    from aiayn.hf import read_chat_template
    from aiayn.serve.chat import ChatTemplateError, compile_template, render

    with pytest.raises(ChatTemplateError):
        render(compile_template("{{ messages.__class__.__mro__[1].__subclasses__() }}"), [], None, None)
    with pytest.raises(ChatTemplateError, match="refused the messages: no system"):
        render(compile_template("{{ raise_exception('no system') }}"), [], None, None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": "{{ bos_token }}x"}, {"name": "tool_use", "template": "y"}]}))
    assert read_chat_template(tmp_path) == "{{ bos_token }}x"
    (tmp_path / "chat_template.jinja").write_text("z", encoding="utf-8")
    assert read_chat_template(tmp_path) == "z"


def test_a_bounded_soak_answers_every_request_and_leaves_the_batch_empty(lm, lm_url: str) -> None:
    """300 short requests from 16 clients, streamed and not, some cut by the client: all answered or cancelled,
    and afterwards nothing decodes, waits or stays cached."""
    engine = lm[2]
    rng = random.Random(1)
    words = " ".join(TEXT).split()

    def ask(i: int) -> int:
        body = {"prompt": " ".join(rng.choice(words) for _ in range(1 + i % 7)), "max_tokens": 1 + i % 9,
                "temperature": 0 if i % 2 else 0.7, "seed": i}
        if i % 5 == 0:
            with httpx.stream("POST", lm_url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
                for _ in r.iter_lines():
                    if i % 10 == 0:
                        break  # a client that leaves mid-stream
            return r.status_code
        return httpx.post(lm_url + "/v1/completions", json=body, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert set(pool.map(ask, range(300))) == {200}
    deadline = time.monotonic() + 10
    while (engine.running or engine.queued) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.running == 0 and engine.queued == 0 and engine.batch._stepper is None
