"""`dspark soak`: a bounded load-and-fault run against a running DSpark server; did it lose or alter anything?

    dspark soak --url http://127.0.0.1:30000 --target embedded/target --admin-key-file KEY --duration 600 \\
        --concurrency 32 --out bench/results/soak

First the target's own greedy answers to the greedy prompts are computed with transformers (no speculation),
then `--concurrency` clients send a weighted mix of requests for `--duration` seconds while a changer thread
switches the live dspark state every `--change-every` seconds (policies, thresholds, verify limits, and an
invalid update that must be refused) through `/set_internal_state` and, given `--admin-address`, in turns
through the gRPC admin API:

    greedy       /generate (token ids) or /v1/completions, streamed or not: must equal the reference
    sampled      /v1/chat/completions at temperature 0.8, streamed or not: must answer
    long         a prompt that just fits the context: must answer
    too-long     a prompt beyond the context: must get a 4xx naming the problem
    disconnect   a stream the client closes after its first chunk: the server must carry on
    malformed    bad JSON, a wrong type, a negative max_tokens, an unknown field: must get a 4xx with a reason

Reports requests sent and completed, failures by reason, lost requests (sent, never answered), greedy answers
identical to the reference, tokens/s over time, p50/p99 latency and the server's RSS (its process tree) over
time; writes <out>/soak.json and soak.png. Exits 1 unless nothing was lost or altered, every malformed or
too-long request got a 4xx, the server still answers /health, and (runs of 3 minutes or more) the RSS of the
last minute is within 10% of the second minute's.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

import grpc
import psutil

from dspark.models.errors import ConfigError
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.security import read_secret
from dspark.ops.arg_types import MAX_NEW_TOKENS, SEED, finite_float, http_url, int_in, output_dir

WEIGHTS = {"greedy": 10, "sampled": 3, "long": 1, "too-long": 1, "disconnect": 2, "malformed": 2}
GREEDY_PROMPTS = ("def fibonacci(n):", "import os\nimport sys\n\n\ndef main(", "class Node:\n    ",
                  "for i in range(", "The capital of France is", "def quicksort(items):\n    ")
STATE_CYCLE = ({"policy": "causal"}, {"policy": "fixed", "max_verify_length": 2}, {"policy": "lagged"},
               {"policy": "threshold", "threshold": 0.3}, {"policy": "mtp1"},
               {"policy": "fixed", "max_verify_length": None}, {"policy": "causal", "threshold": None})
INVALID_UPDATE = {"policy": "threshold", "threshold": 7}
RSS_EVERY_S = 2.0
MAX_DURATION_S = 7 * 86400.0  # a week: a soak is a bounded run
BUCKET_S = 10.0


@dataclass
class Outcome:
    kind: str
    expect: str  # "ok", "4xx" or "closed" (the client hung up on purpose)
    at_s: float  # when it was sent, from the start
    latency_s: float = 0.0
    status: Optional[int] = None  # None: no HTTP answer at all
    reason: str = ""
    tokens: int = 0
    identical: Optional[bool] = None  # greedy only

    @property
    def failed(self) -> bool:
        if self.expect == "closed":
            return False
        if self.status is None:
            return True
        return not (200 <= self.status < 300 if self.expect == "ok" else 400 <= self.status < 500)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("soak", help="bounded load-and-fault run against a running server",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--url", type=http_url, required=True, help="the SGLang server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--target", type=Path, required=True, help="the served target (for the greedy references)")
    parser.add_argument("--admin-key-file", type=Path, default=None,
                        help="SGLang's admin key, for the live state changes (none: no changes)")
    parser.add_argument("--admin-address", default=None,
                        help="the replica's gRPC admin API (host:port): every other four changes go through it")
    parser.add_argument("--admin-token-file", type=Path, default=None, help="an admin token of the gRPC admin API")
    parser.add_argument("--duration", type=finite_float, default=60.0, help="seconds of load (it stops by itself)")
    parser.add_argument("--concurrency", type=int_in(1, 1024), default=16, help="clients sending at once (threads)")
    parser.add_argument("--max-new-tokens", type=MAX_NEW_TOKENS, default=32)
    parser.add_argument("--change-every", type=finite_float, default=3.0, help="seconds between live state changes")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--out", type=output_dir, default=Path("out/soak"))
    parser.set_defaults(func=run)


def greedy_references(target: Path, max_new_tokens: int) -> tuple[list[tuple[list[int], list[int], str]], object]:
    """[(prompt ids, the target's own greedy ids, their text)] without speculation, and the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    references = []
    for prompt in GREEDY_PROMPTS:
        ids = tokenizer(prompt).input_ids
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)[0, len(ids):]
        new = out.tolist()
        if tokenizer.eos_token_id in new:  # SGLang stops at EOS and does not return it
            new = new[: new.index(tokenizer.eos_token_id)]
        references.append((ids, new, tokenizer.decode(new, skip_special_tokens=True)))
    return references, tokenizer


class Client:
    """One request over a fresh connection; the answer's status, body or stream, and its latency."""

    def __init__(self, url: str, timeout_s: float):
        parsed = urlparse(url)
        self.host, self.port, self.timeout_s = parsed.hostname, parsed.port, timeout_s

    def call(self, path: str, body, *, method: str = "POST", stream: bool = False, hang_up: bool = False,
             key: Optional[str] = None) -> tuple[int, list[dict] | dict | str]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            if not stream or response.status != 200:
                text = response.read().decode(errors="replace")
                try:
                    return response.status, json.loads(text)
                except json.JSONDecodeError:
                    return response.status, text
            chunks = []
            for line in response:
                line = line.strip()
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    chunks.append(json.loads(line[5:]))
                    if hang_up:
                        break
            return response.status, chunks
        finally:
            connection.close()


class Soak:
    def __init__(self, args: argparse.Namespace, references, tokenizer, context: int, admin_key: Optional[str],
                 admin: Optional[AdminClient]):
        self.args, self.references, self.tokenizer, self.context = args, references, tokenizer, context
        self.client = Client(args.url, timeout_s=max(120.0, args.duration))
        self.admin_key, self.admin, self.begin = admin_key, admin, time.monotonic()
        self.outcomes: list[Outcome] = []
        self.changes: Counter = Counter()
        self.rss: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.begin

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        kinds, weights = zip(*WEIGHTS.items())
        while self.now() < self.args.duration:
            kind = rng.choices(kinds, weights)[0]
            outcome = Outcome(kind, {"too-long": "4xx", "malformed": "4xx", "disconnect": "closed"}.get(kind, "ok"),
                              self.now())
            try:
                getattr(self, "send_" + kind.replace("-", "_"))(rng, outcome)
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
                outcome.reason = f"{type(err).__name__}: {err}"
            outcome.latency_s = self.now() - outcome.at_s
            with self.lock:
                self.outcomes.append(outcome)

    # ------------------------------------------------------------------ the mix

    def send_greedy(self, rng: random.Random, outcome: Outcome) -> None:
        ids, expected, text = rng.choice(self.references)
        stream, limit = rng.random() < 0.5, self.args.max_new_tokens
        if rng.random() < 0.5:
            outcome.status, reply = self.client.call("/generate", {"input_ids": ids, "stream": stream,
                                                                   "sampling_params": {"max_new_tokens": limit,
                                                                                       "temperature": 0}},
                                                     stream=stream)
            if outcome.status == 200:
                final = reply[-1] if stream else reply
                outcome.identical = final["text"] == text if stream else final["output_ids"] == expected
                outcome.tokens = final["meta_info"]["completion_tokens"]
        else:
            outcome.status, reply = self.client.call("/v1/completions", {
                "model": "default", "prompt": ids, "max_tokens": limit, "temperature": 0, "stream": stream},
                stream=stream)
            if outcome.status == 200:
                answer = "".join(c["choices"][0]["text"] for c in reply) if stream else reply["choices"][0]["text"]
                outcome.identical = answer == text
                outcome.tokens = len(self.tokenizer(answer, add_special_tokens=False).input_ids)
        self.note_error(outcome, reply)

    def send_sampled(self, rng: random.Random, outcome: Outcome) -> None:
        stream = rng.random() < 0.5
        outcome.status, reply = self.client.call("/v1/chat/completions", {
            "model": "default", "messages": [{"role": "user", "content": rng.choice(GREEDY_PROMPTS)}],
            "max_tokens": self.args.max_new_tokens, "temperature": 0.8, "stream": stream}, stream=stream)
        if outcome.status == 200:
            answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in reply) if stream \
                else reply["choices"][0]["message"]["content"]
            outcome.tokens = len(self.tokenizer(answer, add_special_tokens=False).input_ids)
        self.note_error(outcome, reply)

    def send_long(self, rng: random.Random, outcome: Outcome) -> None:
        length = self.context - self.args.max_new_tokens - 1
        self.send_ids(rng, outcome, length)

    def send_too_long(self, rng: random.Random, outcome: Outcome) -> None:
        self.send_ids(rng, outcome, self.context + rng.randint(1, 64))

    def send_ids(self, rng: random.Random, outcome: Outcome, length: int) -> None:
        ids = [rng.randrange(100, self.tokenizer.vocab_size) for _ in range(length)]
        outcome.status, reply = self.client.call("/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": self.args.max_new_tokens, "temperature": 0}})
        if outcome.status == 200:
            outcome.tokens = reply["meta_info"]["completion_tokens"]
        self.note_error(outcome, reply)

    def send_disconnect(self, rng: random.Random, outcome: Outcome) -> None:
        ids = rng.choice(self.references)[0]
        outcome.status, _ = self.client.call("/generate", {"input_ids": ids, "stream": True, "sampling_params": {
            "max_new_tokens": 4 * self.args.max_new_tokens, "temperature": 0}}, stream=True, hang_up=True)

    def send_malformed(self, rng: random.Random, outcome: Outcome) -> None:
        path, body = rng.choice([
            ("/generate", b'{"text": "unterminated'),
            ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "ten"}}),
            ("/v1/completions", {"model": "default", "prompt": "x", "max_tokens": -5}),
            ("/v1/completions", {"model": "default", "prompt": "x", "max_tokens": 4, "no_such_field": 1}),
            ("/v1/chat/completions", {"model": "default", "messages": "not a list"}),
        ])
        outcome.status, reply = self.client.call(path, body)
        outcome.reason = f"{path} {str(body)[:60]}"
        if not (400 <= (outcome.status or 0) < 500 and str(reply).strip()):
            outcome.reason += f" -> {outcome.status}: {str(reply)[:200]}"

    def note_error(self, outcome: Outcome, reply) -> None:
        if outcome.status != 200:
            outcome.reason = f"HTTP {outcome.status}: {str(reply)[:200]}"

    # ------------------------------------------------------------------ beside the load

    def change_state(self) -> None:
        """Cycle the live state, four changes over HTTP, then four over gRPC (when given), and so on; the fourth
        of each four is an invalid one that must be refused (HTTP 400, INVALID_ARGUMENT)."""
        step = 0
        while self.now() < self.args.duration:
            time.sleep(self.args.change_every)
            invalid = step % 4 == 3
            update = INVALID_UPDATE if invalid else STATE_CYCLE[step % len(STATE_CYCLE)]
            over_grpc = self.admin is not None and (step // 4) % 2 == 1
            result = self.change_over_grpc(update) if over_grpc else self.change_over_http(update)
            if result in ("applied", "refused") and (result == "refused") != invalid:
                result = "wrongly " + result
            with self.lock:
                self.changes[f"{result} via {'gRPC' if over_grpc else 'HTTP'}"] += 1
            step += 1

    def change_over_http(self, update: dict) -> str:
        try:
            status, _ = self.client.call("/set_internal_state", {"server_args": {"dspark": update}},
                                         key=self.admin_key)
        except (OSError, http.client.HTTPException) as err:
            return type(err).__name__
        return {200: "applied", 400: "refused"}.get(status, f"HTTP {status}")

    def change_over_grpc(self, update: dict) -> str:
        try:
            self.admin.update(update)
        except grpc.RpcError as err:
            return "refused" if err.code() == grpc.StatusCode.INVALID_ARGUMENT else err.code().name
        return "applied"

    def sample_rss(self, server: Optional[psutil.Process]) -> None:
        while self.now() < self.args.duration and server is not None:
            try:
                tree = [server, *server.children(recursive=True)]
                self.rss.append((self.now(), sum(p.memory_info().rss for p in tree) / 2 ** 20))
            except psutil.Error:
                pass
            time.sleep(RSS_EVERY_S)


def listening_process(port: int) -> Optional[psutil.Process]:
    """The process that listens on `port` (the SGLang launcher), or None when it cannot be seen."""
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            return psutil.Process(connection.pid)
    return None


def summarize(soak: Soak, healthy: bool) -> dict:
    outcomes, args = soak.outcomes, soak.args
    ok = [o for o in outcomes if o.expect == "ok" and not o.failed]
    greedy = [o for o in outcomes if o.identical is not None]
    lost = [o for o in outcomes if o.status is None and o.expect != "closed"]
    latencies = sorted(o.latency_s for o in ok) or [0.0]
    buckets = Counter(int(o.at_s // BUCKET_S) for o in outcomes for _ in range(o.tokens))
    minute = lambda m: [r for t, r in soak.rss if m * 60 <= t < (m + 1) * 60]  # noqa: E731
    second, last = minute(1), [r for t, r in soak.rss if t >= args.duration - 60]
    rss_drift = (statistics.mean(last) / statistics.mean(second) - 1) if args.duration >= 180 and second and last \
        else None
    report = {
        "url": args.url, "duration_s": args.duration, "concurrency": args.concurrency,
        "max_new_tokens": args.max_new_tokens, "sent": len(outcomes),
        "completed": sum(o.status is not None for o in outcomes), "by_kind": dict(Counter(o.kind for o in outcomes)),
        "failed": dict(Counter(o.reason.split(":")[0] or "no answer" for o in outcomes if o.failed)),
        "lost": len(lost), "greedy": len(greedy), "greedy_identical": sum(o.identical for o in greedy),
        "malformed_4xx": sum(not o.failed for o in outcomes if o.kind in ("malformed", "too-long")),
        "malformed": sum(o.kind in ("malformed", "too-long") for o in outcomes),
        "latency_p50_s": latencies[len(latencies) // 2], "latency_p99_s": latencies[int(0.99 * (len(latencies) - 1))],
        "tokens_per_s": [[b * BUCKET_S, buckets[b] / BUCKET_S] for b in sorted(buckets)],
        "rss_mb": [[round(t, 1), round(r, 1)] for t, r in soak.rss], "rss_drift_last_vs_second_minute": rss_drift,
        "state_changes": dict(soak.changes), "healthy_after": healthy,
        "failures": [asdict(o) for o in outcomes if o.failed][:50],
    }
    report["passed"] = (report["lost"] == 0 and report["greedy_identical"] == report["greedy"] and healthy
                        and report["malformed_4xx"] == report["malformed"] and not report["failed"]
                        and all(k.split()[0] in ("applied", "refused") for k in soak.changes)
                        and (rss_drift is None or abs(rss_drift) <= 0.10))
    return report


def plot(report: dict, path: Path) -> None:
    from dspark.models.evaluation.plots import plt, save  # matplotlib only when plotting

    fig, (speed, memory) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    if report["tokens_per_s"]:
        speed.plot(*zip(*report["tokens_per_s"]), marker="o")
    speed.set_ylabel("completion tokens/s")
    speed.set_title(f"soak: {report['sent']} requests, {report['lost']} lost, greedy identical "
                    f"{report['greedy_identical']}/{report['greedy']}, p50 {report['latency_p50_s']:.2f} s, "
                    f"p99 {report['latency_p99_s']:.2f} s", fontsize=9)
    if report["rss_mb"]:
        memory.plot(*zip(*report["rss_mb"]))
    memory.set_ylabel("server RSS (MiB)")
    memory.set_xlabel("seconds")
    save(fig, path)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.duration <= MAX_DURATION_S or args.max_new_tokens < 1 or args.change_every <= 0:
        raise ConfigError(f"--duration must be in (0, {MAX_DURATION_S:g}] seconds, --max-new-tokens and --change-every "
                          f"positive; got {args.duration:g}, {args.max_new_tokens} and {args.change_every:g}")
    key = read_secret(args.admin_key_file, "--admin-key-file") if args.admin_key_file else None
    token = read_secret(args.admin_token_file, "--admin-token-file") if args.admin_token_file else None
    if args.admin_address and (token is None or key is None):
        raise ConfigError("--admin-address needs --admin-token-file, and --admin-key-file: changes run only with it")
    client = Client(args.url, timeout_s=60)
    try:
        status, info = client.call("/server_info", None, method="GET")
    except OSError as err:
        raise ConfigError(f"no server answers at {args.url}: {err}") from None
    references, tokenizer = greedy_references(args.target, args.max_new_tokens)
    admin = AdminClient(args.admin_address, Credentials(token), timeout_s=30) if args.admin_address else None
    soak = Soak(args, references, tokenizer, int(info["max_req_input_len"]), key, admin)
    threads = [threading.Thread(target=soak.sample_rss, args=(listening_process(urlparse(args.url).port),))]
    if key:
        threads.append(threading.Thread(target=soak.change_state))
    for thread in threads:
        thread.start()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(soak.worker, range(args.seed * 1000, args.seed * 1000 + args.concurrency)))
    for thread in threads:
        thread.join()
    try:
        healthy = client.call("/health", None, method="GET")[0] == 200
    except OSError:
        healthy = False
    report = summarize(soak, healthy)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out / "soak.png")
    print(json.dumps({k: v for k, v in report.items() if k not in ("tokens_per_s", "rss_mb", "failures")}))
    return 0 if report["passed"] else 1
