#!/usr/bin/env python3
"""wick-serve against the official `openai` client (and raw HTTP where a client would not send
what the test needs): every endpoint streaming and not, every error status, a stream cancelled by
its client freeing its pages (and a non-streamed request whose client disconnects), 32 concurrent
greedy requests (and 32 sampled with a seed each) equal to each alone, --deterministic (a dense
model's completions and embeddings alone equal to them among others), a bounded load test with 0
failures and flat memory, SIGTERM finishing a request in flight.

References: the completions are compared with `wick-generate` (the Generator path, no engine,
no HTTP) and the embeddings with `wick-embed`; the server must give the same tokens and vectors.

    test_serve.py --server build/tools/wick-serve --generate build/tools/wick-generate \
                  --embed build/tools/wick-embed [unittest args]

Models: WICK_SMOLLM2_GGUF (SmolLM2-135M-Instruct Q4_1) and WICK_MINILM_DIR (all-MiniLM-L6-v2).
Exits 77 (skipped) when a model, the server or the `openai` package is missing, unless
WICK_REQUIRE_SMOLLM2=1. WICK_SERVE_PYTHON names an interpreter that has `openai` (the script
re-runs itself with it). WICK_SERVE_LOAD_SECONDS (default 20) and WICK_SERVE_LOAD_STREAMS
(default 16) size the load test.
"""

import argparse
import base64
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

SKIP = 77


def reexec_with_serve_python():
    py = os.environ.get("WICK_SERVE_PYTHON")
    if py and os.path.exists(py) and not os.environ.get("WICK_SERVE_REEXECUTED"):
        os.environ["WICK_SERVE_REEXECUTED"] = "1"
        os.execv(py, [py] + sys.argv)


def skip_or_fail(message):
    if os.environ.get("WICK_REQUIRE_SMOLLM2") == "1":
        print(f"test_serve: {message} (WICK_REQUIRE_SMOLLM2=1: failing)", file=sys.stderr)
        sys.exit(1)
    print(f"test_serve: skipped: {message}", file=sys.stderr)
    sys.exit(SKIP)


ARGS = None
SMOL = "SmolLM2-135M-Instruct.Q4_1"
MINI = None  # the MiniLM folder's name


class WickServer:
    """A wick-serve process on a free port; its stderr is kept (one line per request)."""

    def __init__(self, *extra, models=None):
        if models is None:
            models = [os.environ["WICK_SMOLLM2_GGUF"], os.environ["WICK_MINILM_DIR"]]
        cmd = [ARGS.server, "--port", "0", *models, *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(120) or self.port is None:
            self.proc.kill()
            raise RuntimeError("wick-serve did not start:\n" + "".join(self.lines))
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self, key="unused", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(10)
        self.proc.stderr.close()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        text = http(self, "GET", "/metrics")[2].decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def idle_metrics(self, model, seconds):
        """/metrics once `model` holds no KV pages and runs no sequence, or after `seconds`."""
        key = f'{{model="{model}"}}'
        deadline = time.time() + seconds
        while True:
            m = self.metrics()
            if (m["wick_kv_pages_used" + key] == 0 and m["wick_running_batch_size" + key] == 0) \
                    or time.time() >= deadline:
                return m
            time.sleep(0.1)


def http(server, method, path, body=None, headers=None, timeout=60):
    """(status, headers, body bytes) of one request by urllib."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(server.base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def error_of(body):
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def generate_reference(prompt, max_new):
    """wick-generate's greedy continuation of `prompt` (no engine, no HTTP)."""
    out = subprocess.run([ARGS.generate, os.environ["WICK_SMOLLM2_GGUF"], "--prompt", prompt,
                          "--max-new", str(max_new), "--temperature", "0", "--json", "-q"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def embed_reference(texts):
    out = subprocess.run([ARGS.embed, os.environ["WICK_MINILM_DIR"], "-q", "--batch", "1"],
                         input="\n".join(texts) + "\n", capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def concurrent_prompts(n):
    """n prompts of different lengths and subjects."""
    subjects = ["the sea", "Rome", "a fox", "tea", "jazz", "rain", "maps", "code"]
    return [f"Question {i}: what is {i} plus {i + 3}? Answer:" if i % 4 == 0 else
            f"Write {i % 3 + 1} short lines about {subjects[i % 8]}" + " please" * (i % 5) + "."
            for i in range(n)]


def close_to(a, b, tol):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


class Serve(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        cls.server = WickServer()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        # SIGTERM with nothing in flight: exit 0.
        assert cls.server.proc.returncode == 0, cls.server.proc.returncode

    # --- models, health, metrics -------------------------------------------------------------
    def test_models(self):
        ids = sorted(m.id for m in self.client.models.list().data)
        self.assertEqual(ids, sorted([SMOL, MINI]))

    def test_health_and_metrics(self):
        status, _, body = http(self.server, "GET", "/health")
        self.assertEqual((status, json.loads(body)["status"]), (200, "ok"))
        http(self.server, "GET", "/no/such/path")
        text = http(self.server, "GET", "/metrics")[2].decode()
        for name in ["wick_requests_total", "wick_prompt_tokens_total",
                     "wick_generated_tokens_total", "wick_queue_depth", "wick_running_batch_size",
                     "wick_kv_pages_used", "wick_time_to_first_token_seconds_bucket",
                     "wick_inter_token_latency_seconds_bucket"]:
            self.assertIn(name, text)
        self.assertIn('wick_requests_total{endpoint="/health",status="200"}', text)
        self.assertIn('wick_requests_total{endpoint="other",status="404"}', text)

    # --- completions ---------------------------------------------------------------------------
    def test_completion_matches_wick_generate(self):
        prompt = "The capital of France is"
        ref = generate_reference(prompt, 12)
        r = self.client.completions.create(model=SMOL, prompt=prompt, max_tokens=12,
                                           temperature=0)
        self.assertEqual(r.choices[0].text, ref["text"])
        self.assertEqual(r.choices[0].finish_reason, ref["finish_reason"])
        self.assertEqual((r.usage.prompt_tokens, r.usage.completion_tokens),
                         (ref["usage"]["prompt_tokens"], ref["usage"]["completion_tokens"]))
        # Streamed: the same text, piece by piece, then the finish reason.
        pieces, finish = [], None
        for chunk in self.client.completions.create(model=SMOL, prompt=prompt, max_tokens=12,
                                                    temperature=0, stream=True):
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        self.assertGreater(len([p for p in pieces if p]), 3)
        self.assertEqual("".join(pieces), ref["text"])
        self.assertEqual(finish, ref["finish_reason"])

    def test_completion_prompt_list_and_ids(self):
        prompts = ["The capital of France is", "Water boils at"]
        alone = [self.client.completions.create(model=SMOL, prompt=p, max_tokens=8,
                                                temperature=0).choices[0].text for p in prompts]
        r = self.client.completions.create(model=SMOL, prompt=prompts, max_tokens=8,
                                           temperature=0)
        self.assertEqual([c.text for c in sorted(r.choices, key=lambda c: c.index)], alone)
        texts = ["", ""]
        for chunk in self.client.completions.create(model=SMOL, prompt=prompts, max_tokens=8,
                                                    temperature=0, stream=True):
            for c in chunk.choices:
                texts[c.index] += c.text
        self.assertEqual(texts, alone)
        # Token ids as the prompt (wick-generate's output ids): taken as they are.
        ids = generate_reference(prompts[0], 12)["ids"]
        r = self.client.completions.create(model=SMOL, prompt=ids, max_tokens=4, temperature=0)
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        self.assertEqual(r.usage.completion_tokens, 4)
        import openai
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=SMOL, prompt=[1, 10 ** 9], max_tokens=1)
        self.assertEqual(e.exception.body["param"], "prompt")

    def test_stop_and_seed(self):
        ref = generate_reference("The capital of France is", 12)["text"]  # " Paris.\n\nThe ..."
        stop = ref[len(ref) // 2:len(ref) // 2 + 3]
        self.assertTrue(stop.strip())
        r = self.client.completions.create(model=SMOL, prompt="The capital of France is",
                                           max_tokens=12, temperature=0, stop=[stop, "@@@@"])
        self.assertEqual(r.choices[0].text, ref[:ref.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        a, b = [self.client.completions.create(model=SMOL, prompt="Once upon a time",
                                               max_tokens=16, temperature=1.0, seed=7
                                               ).choices[0].text for _ in range(2)]
        self.assertEqual(a, b)

    # --- chat ----------------------------------------------------------------------------------
    def test_chat(self):
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        r = self.client.chat.completions.create(model=SMOL, messages=messages, max_tokens=24,
                                                temperature=0)
        text = r.choices[0].message.content
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn("Paris", text)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        # max_completion_tokens, the newer name, limits the same way.
        r2 = self.client.chat.completions.create(model=SMOL, messages=messages, temperature=0,
                                                 max_completion_tokens=3)
        self.assertEqual((r2.usage.completion_tokens, r2.choices[0].finish_reason), (3, "length"))
        # Streamed: role first, the same text, usage last with include_usage.
        chunks = list(self.client.chat.completions.create(
            model=SMOL, messages=messages, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(streamed, text)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)
        # The raw stream ends with [DONE].
        status, headers, body = http(self.server, "POST", "/v1/chat/completions",
                                     {"model": SMOL, "messages": messages, "max_tokens": 4,
                                      "stream": True})
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/event-stream"))
        self.assertTrue(body.decode().rstrip().endswith("data: [DONE]"))

    # --- embeddings ----------------------------------------------------------------------------
    def test_embeddings_match_wick_embed(self):
        texts = ["A man is eating food.", "Someone is having a meal.", "The stock market fell."]
        ref = embed_reference(texts)
        # The client asks base64 by default; float explicitly.
        r = self.client.embeddings.create(model=MINI, input=texts)
        rf = self.client.embeddings.create(model=MINI, input=texts, encoding_format="float")
        for got in (r, rf):
            self.assertEqual([d.index for d in got.data], [0, 1, 2])
            for d, want in zip(got.data, ref):
                self.assertTrue(close_to(d.embedding, want, 1e-4))
                self.assertAlmostEqual(sum(x * x for x in d.embedding), 1.0, places=4)
        one = self.client.embeddings.create(model=MINI, input=texts[1], encoding_format="float")
        self.assertTrue(close_to(one.data[0].embedding, ref[1], 1e-4))
        self.assertGreater(r.usage.prompt_tokens, 3 * 3)
        # Raw base64: little-endian float32.
        status, _, body = http(self.server, "POST", "/v1/embeddings",
                               {"model": MINI, "input": texts[0], "encoding_format": "base64"})
        raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
        self.assertTrue(close_to(struct.unpack(f"<{len(raw) // 4}f", raw), ref[0], 1e-4))

    def test_embeddings_batched_across_requests(self):
        texts = [f"sentence number {i} about {w}" for i, w in
                 enumerate(["cats", "dogs", "stocks", "rain", "tea", "code", "maps", "jazz"] * 2)]
        ref = embed_reference(texts)
        before = self.server.metrics()[f'wick_embedding_batches_total{{model="{MINI}"}}']
        with cf.ThreadPoolExecutor(len(texts)) as pool:
            got = list(pool.map(lambda t: self.client.embeddings.create(
                model=MINI, input=t, encoding_format="float").data[0].embedding, texts))
        after = self.server.metrics()[f'wick_embedding_batches_total{{model="{MINI}"}}']
        for g, want in zip(got, ref):
            self.assertTrue(close_to(g, want, 1e-4))
        self.assertLess(after - before, len(texts))  # some requests shared a batch

    # --- errors --------------------------------------------------------------------------------
    def test_errors(self):
        import openai
        status, _, body = http(self.server, "POST", "/v1/chat/completions", b"{not json")
        self.assertEqual(status, 400)
        error_of(body)
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=SMOL, messages=[{"role": "user",
                                                                       "content": "x"}],
                                                temperature="hot")
        self.assertEqual(e.exception.body["param"], "temperature")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=SMOL, messages=[])
        self.assertEqual(e.exception.body["param"], "messages")
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.completions.create(model="no-such-model", prompt="x")
        self.assertEqual(e.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError):
            self.client.embeddings.create(model=MINI, input="")
        # A prompt longer than the context: 400 naming both lengths.
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=SMOL, prompt=[42] * 8200, max_tokens=1)
        self.assertIn("8200", e.exception.body["message"])
        self.assertIn("8192", e.exception.body["message"])
        self.assertEqual(e.exception.body["code"], "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=SMOL, prompt="x", max_tokens=10 ** 6)
        self.assertEqual(e.exception.body["param"], "max_tokens")

    def test_garbage_and_slow_clients_do_not_stop_others(self):
        garbage = socket.create_connection(("127.0.0.1", self.server.port))
        garbage.sendall(bytes(range(256)) * 8 + b"\r\n\r\n")
        slow = socket.create_connection(("127.0.0.1", self.server.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        half = socket.create_connection(("127.0.0.1", self.server.port))
        half.sendall(b"GET /v1/mod")
        t0 = time.time()
        r = self.client.completions.create(model=SMOL, prompt="Hello", max_tokens=2)
        self.assertEqual(len(r.choices), 1)
        self.assertLess(time.time() - t0, 30)
        garbage.settimeout(30)
        reply = garbage.recv(4096)
        self.assertTrue(reply == b"" or reply.startswith(b"HTTP/1.1 400"), reply[:80])
        for s in (garbage, slow, half):
            s.close()
        self.assertEqual(http(self.server, "GET", "/health")[0], 200)

    def test_connection_burst(self):
        # 64 clients connecting at once, three times: none is refused or reset (the listen
        # backlog holds them).
        n = 64
        start = threading.Barrier(n)
        results = [None] * n

        def one(i):
            start.wait()
            try:
                status, _, body = http(self.server, "POST", "/v1/completions",
                                       {"model": SMOL, "prompt": f"Hello {i}", "max_tokens": 8,
                                        "stream": True}, timeout=300)
                results[i] = (status, body.decode().rstrip().endswith("data: [DONE]"))
            except OSError as e:
                results[i] = repr(e)
        for _ in range(4):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(results, [(200, True)] * n)

    def test_port_in_use(self):
        r = subprocess.run([ARGS.server, "--port", str(self.server.port),
                            os.environ["WICK_SMOLLM2_GGUF"]], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot listen", r.stderr)

    # --- cancellation, batch invariance, load --------------------------------------------------
    def test_cancelled_stream_frees_pages(self):
        key = f'{{model="{SMOL}"}}'
        cancelled = 'wick_requests_cancelled_total{endpoint="/v1/completions"}'
        before = self.server.metrics().get(cancelled, 0)
        # Greedy from this prompt runs hundreds of tokens without an end of text.
        stream = self.client.completions.create(model=SMOL,
                                                prompt="Once upon a time, in a land far away,",
                                                max_tokens=4000, temperature=0, stream=True)
        it = iter(stream)
        for _ in range(3):
            next(it)
        m = self.server.metrics()
        self.assertGreater(m["wick_kv_pages_used" + key], 0)
        self.assertGreater(m["wick_running_batch_size" + key], 0)
        stream.close()
        m = self.server.idle_metrics(SMOL, 30)
        self.assertEqual(m["wick_kv_pages_used" + key], 0)
        self.assertEqual(m["wick_running_batch_size" + key], 0)
        self.assertEqual(m.get(cancelled, 0), before + 1)

    def test_disconnected_client_cancels_non_streamed(self):
        # A non-streamed request for two long completions over a raw socket; the client leaves
        # while they generate (as one whose read timed out): both are cancelled, their pages
        # freed, the cancel counted and logged, and the server answers the next request.
        key = f'{{model="{SMOL}"}}'
        cancelled = 'wick_requests_cancelled_total{endpoint="/v1/completions"}'
        before = self.server.metrics()
        logged = len(self.server.lines)
        body = json.dumps({"model": SMOL, "max_tokens": 4000, "temperature": 0,
                           "prompt": ["Once upon a time, in a land far away,",
                                      "Once upon a time, in a land far away, there"]}).encode()
        client = socket.create_connection(("127.0.0.1", self.server.port))
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        gen = "wick_generated_tokens_total" + key
        deadline = time.time() + 60
        while time.time() < deadline:
            m = self.server.metrics()
            if m[gen] >= before[gen] + 8:
                break
            time.sleep(0.1)
        self.assertGreater(m["wick_kv_pages_used" + key], 0)
        self.assertEqual(m["wick_running_batch_size" + key], 2)
        client.close()
        m = self.server.idle_metrics(SMOL, 10)
        self.assertEqual(m["wick_kv_pages_used" + key], 0)
        self.assertEqual(m["wick_running_batch_size" + key], 0)
        self.assertEqual(m.get(cancelled, 0), before.get(cancelled, 0) + 1)
        # Nothing generates any more.
        stopped = m[gen]
        time.sleep(0.5)
        self.assertEqual(self.server.metrics()[gen], stopped)
        deadline = time.time() + 10
        while time.time() < deadline:
            gone = [line for line in self.server.lines[logged:] if "cancelled=client_gone" in line]
            if gone:
                break
            time.sleep(0.1)
        self.assertEqual(len(gone), 1, self.server.lines[logged:])
        self.assertIn("POST /v1/completions 499 ", gone[0])
        r = self.client.completions.create(model=SMOL, prompt="Hello", max_tokens=3,
                                           temperature=0)
        self.assertEqual((r.choices[0].finish_reason, r.usage.completion_tokens), ("length", 3))

    def test_client_timeout_cancels_chat(self):
        # The `openai` client giving up on a non-streamed chat completion (its read timed out)
        # closes the connection: the server cancels the generation.
        import openai
        key = f'{{model="{SMOL}"}}'
        cancelled = 'wick_requests_cancelled_total{endpoint="/v1/chat/completions"}'
        before = self.server.metrics().get(cancelled, 0)
        impatient = self.server.client(timeout=1.0)
        with self.assertRaises(openai.APITimeoutError):
            impatient.chat.completions.create(
                model=SMOL, max_tokens=4000, temperature=0,
                messages=[{"role": "user", "content": "Write a very long story about a dragon."}])
        m = self.server.idle_metrics(SMOL, 10)
        self.assertEqual(m["wick_kv_pages_used" + key], 0)
        self.assertEqual(m["wick_running_batch_size" + key], 0)
        self.assertEqual(m.get(cancelled, 0), before + 1)

    def concurrent_equals_alone(self, prompts, **sampling):
        """Each prompt's completion alone (one after another), then all at once: equal."""
        def run(i):
            return self.client.completions.create(model=SMOL, prompt=prompts[i], max_tokens=12,
                                                  **{k: v(i) if callable(v) else v
                                                     for k, v in sampling.items()}
                                                  ).choices[0].text
        alone = [run(i) for i in range(len(prompts))]
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(run, range(len(prompts))))
        self.assertEqual(together, alone)
        return alone

    def test_concurrent_greedy_equals_alone(self):
        # 32 prompts of different lengths (the batch's prefill chunks and rows differ from the
        # solo runs'), greedy.
        alone = self.concurrent_equals_alone(concurrent_prompts(32), temperature=0)
        self.assertGreater(len(set(alone)), 16)

    def test_concurrent_seeded_sampling_equals_alone(self):
        # The same at temperature 0.8 with a seed per request: each request's own draws.
        alone = self.concurrent_equals_alone(concurrent_prompts(32), temperature=0.8, top_p=0.95,
                                             seed=lambda i: 1000 + i)
        self.assertGreater(len(set(alone)), 16)
        greedy = [self.client.completions.create(model=SMOL, prompt=p, max_tokens=12,
                                                 temperature=0).choices[0].text
                  for p in concurrent_prompts(4)]
        self.assertNotEqual(alone[:4], greedy)  # it sampled

    def test_load(self):
        seconds = float(os.environ.get("WICK_SERVE_LOAD_SECONDS", "20"))
        streams = int(os.environ.get("WICK_SERVE_LOAD_STREAMS", "16"))
        client = self.server.client(timeout=120)
        stop_at = time.time() + seconds
        done, failures, lock = [0], [], threading.Lock()
        rss = []

        def worker(i):
            n = 0
            while time.time() < stop_at:
                try:
                    text = ""
                    for c in client.chat.completions.create(
                            model=SMOL, max_tokens=16, temperature=0.7, stream=True,
                            messages=[{"role": "user", "content": f"Say something about {i}-{n}"}]):
                        if c.choices:
                            text += c.choices[0].delta.content or ""
                    with lock:
                        done[0] += 1
                except Exception as e:  # noqa: BLE001 (every failure counts)
                    with lock:
                        failures.append(repr(e))
                n += 1

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss.append(self.server.rss_kib())
            time.sleep(0.5)
        for t in threads:
            t.join()
        self.assertEqual(failures, [])
        self.assertGreaterEqual(done[0], streams)
        # Flat memory: the second half's peak within 10% (+16 MiB) of the first half's.
        half = len(rss) // 2
        first, second = max(rss[:half]), max(rss[half:])
        print(f"\nload: {streams} streams, {seconds:.0f} s, {done[0]} requests, RSS first half "
              f"{first / 1024:.0f} MiB, second half {second / 1024:.0f} MiB", file=sys.stderr)
        self.assertLessEqual(second, first * 1.10 + 16 * 1024)


def tiny_dense_model(folder):
    """tests/data's tiny Qwen3 (f32, random weights) in `folder`, with a tokenizer of its 96 ids:
    the printable ASCII characters."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "families",
                       "qwen3")
    os.makedirs(folder, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, name), folder)
    vocab = {chr(32 + i): i for i in range(96)}
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "added_tokens": [], "normalizer": None,
                   "pre_tokenizer": None, "post_processor": None, "decoder": None,
                   "model": {"type": "BPE", "vocab": vocab, "merges": []}}, f)
    return folder


class Deterministic(unittest.TestCase):
    """--deterministic (over WICK_BATCH_INVARIANT=0 in the environment): a dense f32 model's
    completions and MiniLM's embeddings give each request the same result alone or among others
    (embeddings compared bit for bit: without the switch they differ; completions token for
    token, which the API gives).
    A KV pool of 8 pages (of 4096 bytes: 2 layers, 16 positions, 2 KV heads of 8 f32; a request
    takes up to 4) makes concurrent requests preempt each other (their tokens prefilled again as
    one chunk, where alone they were decoded one by one)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="wick-serve-det-")
        tiny = tiny_dense_model(os.path.join(cls.tmp, "tiny_qwen3"))
        old = os.environ.get("WICK_BATCH_INVARIANT")
        os.environ["WICK_BATCH_INVARIANT"] = "0"
        try:
            # An embeddings batch waits 50 ms for more requests: the concurrent ones share one.
            cls.server = WickServer("--deterministic", "--kv-memory", str(8 * 4096),
                                    "--page-size", "16",
                                    "--embed-window-us", "50000",
                                    models=[tiny, os.environ["WICK_MINILM_DIR"]])
        finally:
            if old is None:
                del os.environ["WICK_BATCH_INVARIANT"]
            else:
                os.environ["WICK_BATCH_INVARIANT"] = old
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_dense_completions_alone_equal_concurrent(self):
        self.assertEqual(self.server.metrics()['wick_kv_pages_total{model="tiny_qwen3"}'], 8)
        prompts = [[(i * 37 + j * 11) % 93 + 3 for j in range(3 + i % 9)] for i in range(32)]

        def run(i, **sampling):
            return self.client.completions.create(model="tiny_qwen3", prompt=prompts[i],
                                                  max_tokens=40, **sampling).choices[0].text
        for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 7}):
            alone = [run(i, **sampling) for i in range(32)]
            with cf.ThreadPoolExecutor(32) as pool:
                together = list(pool.map(lambda i: run(i, **sampling), range(32)))
            self.assertEqual(together, alone, sampling)
            self.assertGreater(len(set(alone)), 8)
        self.assertGreater(self.server.metrics()['wick_preemptions_total{model="tiny_qwen3"}'], 0)

    def test_embeddings_alone_equal_batched_bits(self):
        texts = [f"sentence {i} of {'several ' * (i % 6)}words about {w}" for i, w in
                 enumerate(["cats", "dogs", "stocks", "rain", "tea", "code", "maps", "jazz"] * 2)]

        def bits(text):
            status, _, body = http(self.server, "POST", "/v1/embeddings",
                                   {"model": MINI, "input": text, "encoding_format": "base64"})
            self.assertEqual(status, 200)
            return json.loads(body)["data"][0]["embedding"]
        key = f'wick_embedding_batches_total{{model="{MINI}"}}'
        alone = [bits(t) for t in texts]
        before = self.server.metrics()[key]
        with cf.ThreadPoolExecutor(len(texts)) as pool:
            together = list(pool.map(bits, texts))
        self.assertLess(self.server.metrics()[key] - before, len(texts))  # some shared a batch
        self.assertEqual(together, alone)
        # One request of all of them: one batch.
        r = self.client.embeddings.create(model=MINI, input=texts)
        self.assertEqual([d.embedding for d in r.data],
                         [list(struct.unpack(f"<{len(base64.b64decode(a)) // 4}f",
                                             base64.b64decode(a))) for a in alone])


class Strict(unittest.TestCase):
    """A server with an API key, a small body limit and a queue of one."""

    @classmethod
    def setUpClass(cls):
        cls.server = WickServer("--api-key", "sekrit", "--max-body", "4096", "--max-batch", "1",
                                "--max-queue", "1")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_api_key(self):
        import openai
        with self.assertRaises(openai.AuthenticationError):
            self.server.client().models.list()
        with self.assertRaises(openai.AuthenticationError):
            self.server.client(key="wrong").models.list()
        status, _, body = http(self.server, "GET", "/v1/models")
        self.assertEqual(status, 401)
        error_of(body)
        ids = [m.id for m in self.server.client(key="sekrit").models.list().data]
        self.assertIn(SMOL, ids)

    def test_body_too_large(self):
        auth = {"Authorization": "Bearer sekrit"}
        big = {"model": SMOL, "prompt": "x" * 5000, "max_tokens": 1}
        status, _, body = http(self.server, "POST", "/v1/completions", big, auth)
        self.assertEqual(status, 413)
        error_of(body)
        small = {"model": SMOL, "prompt": "x", "max_tokens": 1}
        self.assertEqual(http(self.server, "POST", "/v1/completions", small, auth)[0], 200)

    def test_queue_full(self):
        auth = {"Authorization": "Bearer sekrit"}
        req = {"model": SMOL, "prompt": "Tell me a story.", "max_tokens": 48}
        with cf.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: http(self.server, "POST", "/v1/completions", req,
                                                   auth), range(6)))
        statuses = sorted(r[0] for r in results)
        self.assertIn(429, statuses)
        self.assertIn(200, statuses)
        for status, headers, body in results:
            if status == 429:
                self.assertIn("Retry-After", headers)
                self.assertEqual(error_of(body)["type"], "rate_limit_error")


class Cli(unittest.TestCase):
    """The command line (tools/cli.h's exit codes): nothing is served."""

    def run_serve(self, *args):
        return subprocess.run([ARGS.server, *args], capture_output=True, text=True, timeout=120)

    def test_help_and_usage_errors(self):
        r = self.run_serve("--help")
        self.assertEqual(r.returncode, 0)
        for option in ("--host", "--port", "--api-key", "--device", "--dtype", "--max-batch",
                       "--kv-memory", "--max-queue", "--deterministic", "--cuda-graphs",
                       "--greedy-lookahead", "--page-size"):
            self.assertIn(option, r.stdout)
        self.assertEqual(self.run_serve().returncode, 2)  # no PATH
        self.assertEqual(self.run_serve("--port", "70000", "x.gguf").returncode, 2)
        r = self.run_serve("/nonexistent/model.gguf")
        self.assertEqual(r.returncode, 2)
        self.assertIn("/nonexistent/model.gguf", r.stderr)
        gguf = os.environ["WICK_SMOLLM2_GGUF"]
        self.assertEqual(self.run_serve("--device", "gpu", gguf).returncode, 2)
        self.assertEqual(self.run_serve(gguf, gguf).returncode, 2)  # the same id twice
        r = self.run_serve("--cuda-graphs", gguf)  # graphs need CUDA
        self.assertEqual(r.returncode, 2)
        self.assertIn("--cuda-graphs needs --device cuda", r.stderr)
        r = self.run_serve("--greedy-lookahead", "0", gguf)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--greedy-lookahead must be at least 1", r.stderr)
        r = self.run_serve("--page-size", "-16", gguf)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--page-size", r.stderr)


class Sigterm(unittest.TestCase):
    def test_sigterm_finishes_in_flight(self):
        server = WickServer()
        try:
            stream = server.client().completions.create(model=SMOL, prompt="Once upon a time",
                                                        max_tokens=40, temperature=0, stream=True)
            it = iter(stream)
            first = next(it).choices[0].text
            server.proc.send_signal(signal.SIGTERM)
            rest = [c for c in it]
            self.assertEqual(rest[-1].choices[0].finish_reason, "length")
            text = first + "".join(c.choices[0].text for c in rest)
            self.assertEqual(text, generate_reference("Once upon a time", 40)["text"])
            self.assertEqual(server.proc.wait(60), 0)
            self.assertTrue(any("stopped" in line for line in server.lines))
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
            server.stop()


def main():
    global ARGS, MINI
    reexec_with_serve_python()
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--generate", required=True)
    parser.add_argument("--embed", required=True)
    ARGS, rest = parser.parse_known_args()
    for var in ("WICK_SMOLLM2_GGUF", "WICK_MINILM_DIR"):
        if not os.path.exists(os.environ.get(var, "")):
            skip_or_fail(f"{var} does not name a model")
    for exe in (ARGS.server, ARGS.generate, ARGS.embed):
        if not os.access(exe, os.X_OK):
            skip_or_fail(f"{exe} is not built (wick-serve needs libcpp-httplib-dev)")
    try:
        import openai  # noqa: F401
    except ImportError:
        skip_or_fail("the `openai` package is missing (pip install -r tests/serve/requirements.txt;"
                     " WICK_SERVE_PYTHON names an interpreter that has it)")
    MINI = os.path.basename(os.path.normpath(os.environ["WICK_MINILM_DIR"]))
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
