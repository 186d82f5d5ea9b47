"""A fake dataplane for gateway tests: a real grpc.aio `Inference` server in a
background thread, with a tiny deterministic byte-level BPE tokenizer and a
deterministic "model".

The model answers with the tokens of the last user message (found between the
`<|user|>` and `<|end|>` special tokens of the prompt):

* temperature 0: those tokens in order, then `</s>` (finish STOP); with
  ignore_eos they repeat until max_tokens;
* temperature > 0: as many tokens drawn from them with random.Random(seed)
  (fresh entropy without a seed), then `</s>`;
* it honours max_tokens and the context length (finish LENGTH) and
  stop_token_ids (finish STOP after the stop token);
* with `logprobs` it sends `fake_logprobs` for every token (the one at
  generated position p, 1-based, at -p/10), and with `prompt_logprobs` for
  prompt token j >= 1 (at -j/100), on the first response.

It streams `tokens_per_message` tokens per response, sleeping `delay_s`
before each, and records every request, the ones running, and the ones the
client cancelled, so tests can assert cancellation reached the dataplane.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field

import grpc
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pagedweight.v1 import inference_pb2, inference_pb2_grpc

BOS, EOS, USER, ASSISTANT, SYSTEM, END = "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"
SPECIAL_TOKENS = [BOS, EOS, SYSTEM, USER, ASSISTANT, END]
VOCAB_SIZE = 320
CORPUS = [
    "Hello world, hello there. The quick brown fox jumps over the lazy dog.",
    "one two three four five six seven eight nine ten",
    "PagedWeight serves mixture of experts models when memory is contested.",
    "Tokens stream back to the client one by one; stop strings cut the text.",
] * 4
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MODEL_NAME = "fake-moe"


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE trained on CORPUS; the same JSON on every call."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return tokenizer


def build_metaspace_tokenizer() -> Tokenizer:
    """A word-level tokenizer with SentencePiece's "▁" space marker, whose
    decoder drops the marker of the first token ("▁world" alone decodes to
    "world"), like Llama's and Mixtral's; plus the chat special tokens."""
    words = ["Hello", "world", "again", "one", "two"]
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, "<unk>", *(f"▁{w}" for w in words)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer


def fake_logprobs(token: int, logprob: float, top_n: int) -> inference_pb2.TokenLogprobs:
    """`token` at `logprob`, and alternative k (0-based) token + k at
    logprob - k/2, so the token itself is the most likely."""
    return inference_pb2.TokenLogprobs(
        logprob=logprob,
        top_token_ids=[(token + k) % VOCAB_SIZE for k in range(top_n)],
        top_logprobs=[logprob - k / 2 for k in range(top_n)],
    )


@dataclass
class FakeState:
    """What the fake saw; guarded by `lock` (the server runs in another thread)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[inference_pb2.GenerateRequest] = field(default_factory=list)
    active: set[str] = field(default_factory=set)
    aborted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)


class FakeInference(inference_pb2_grpc.InferenceServicer):
    def __init__(self, owner: FakeDataplane) -> None:
        self._owner = owner
        tok = owner.tokenizer
        self._eos = tok.token_to_id(EOS)
        self._user = tok.token_to_id(USER)
        self._specials = {tok.token_to_id(t) for t in SPECIAL_TOKENS}

    def _reply(self, prompt: list[int]) -> list[int]:
        start = max((i for i, t in enumerate(prompt) if t == self._user), default=-1) + 1
        reply = []
        for token in prompt[start:]:
            if token in self._specials:
                break
            reply.append(token)
        return reply or [self._eos]

    def _plan(self, request: inference_pb2.GenerateRequest) -> list[int]:
        """The tokens this request would produce without any limit (maybe long)."""
        sampling = request.sampling
        reply = self._reply(list(request.prompt_token_ids))
        if sampling.temperature > 0:
            rng = random.Random(sampling.seed) if sampling.HasField("seed") else random.Random()
            reply = [rng.choice(reply) for _ in reply]
        if sampling.ignore_eos:
            repeats = sampling.max_tokens // len(reply) + 1
            return reply * repeats
        return [*reply, self._eos]

    async def Generate(self, request, context):  # noqa: N802 (gRPC naming)
        owner = self._owner
        sampling = request.sampling
        prompt = list(request.prompt_token_ids)
        if not prompt or len(prompt) >= owner.context_length:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty prompt or prompt longer than context")
        if sampling.max_tokens < 1 or sampling.temperature < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad sampling parameters")
        if owner.fail_with is not None:
            await context.abort(owner.fail_with, "injected failure")
        rid = request.request_id
        with owner.state.lock:
            owner.state.requests.append(request)
            owner.state.active.add(rid)
        stops = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stops.add(self._eos)
        limit = min(sampling.max_tokens, owner.context_length - len(prompt))
        plan = self._plan(request)
        generated = 0
        try:
            while True:
                await asyncio.sleep(owner.delay_s)
                chunk: list[int] = []
                reason = inference_pb2.FINISH_REASON_UNSPECIFIED
                while len(chunk) < owner.tokens_per_message:
                    token = plan[generated]
                    chunk.append(token)
                    generated += 1
                    if token in stops:
                        reason = inference_pb2.FINISH_REASON_STOP
                    elif generated >= limit:
                        reason = inference_pb2.FINISH_REASON_LENGTH
                    if reason != inference_pb2.FINISH_REASON_UNSPECIFIED:
                        break
                logprobs = []
                if sampling.HasField("logprobs"):
                    first = generated - len(chunk) + 1  # 1-based position of chunk[0]
                    logprobs = [
                        fake_logprobs(token, -(first + i) / 10, sampling.logprobs) for i, token in enumerate(chunk)
                    ]
                prompt_logprobs = []
                if sampling.HasField("prompt_logprobs") and generated == len(chunk):  # the first response
                    prompt_logprobs = [
                        fake_logprobs(token, -j / 100, sampling.prompt_logprobs)
                        for j, token in enumerate(prompt[1:], start=1)
                    ]
                yield inference_pb2.GenerateResponse(
                    request_id=rid,
                    token_ids=chunk,
                    finish_reason=reason,
                    prompt_tokens=len(prompt),
                    completion_tokens=generated,
                    logprobs=logprobs,
                    prompt_logprobs=prompt_logprobs,
                    cached_prompt_tokens=int(len(prompt) * owner.cached_fraction),
                )
                if reason != inference_pb2.FINISH_REASON_UNSPECIFIED:
                    with owner.state.lock:
                        owner.state.finished.append(rid)
                    return
                drops = owner.drop_after_tokens
                if drops and generated >= drops[0]:
                    owner.drop_after_tokens = drops[1:]
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "injected loss of the connection")
        except (asyncio.CancelledError, GeneratorExit):
            # A cancelled call ends this handler with CancelledError when it
            # waits in the sleep, or with GeneratorExit (grpc closes the
            # generator) when the server was sending its last message.
            with owner.state.lock:
                owner.state.aborted.append(rid)
            raise
        finally:
            with owner.state.lock:
                owner.state.active.discard(rid)

    async def GetModelInfo(self, request, context):  # noqa: N802
        owner = self._owner
        return inference_pb2.ModelInfo(
            model_name=MODEL_NAME,
            context_length=owner.context_length,
            tokenizer_json=owner.tokenizer.to_str(),
            chat_template=owner.chat_template,
            eos_token_ids=[self._eos],
            bos_token=BOS,
            eos_token=EOS,
            family="fake",
        )

    async def GetEngineStats(self, request, context):  # noqa: N802
        state = self._owner.state
        with state.lock:
            running, aborted, finished = len(state.active), len(state.aborted), len(state.finished)
        arena = inference_pb2.ArenaStats(
            page_bytes=2 * 1024 * 1024, total_pages=512, free_pages=200, kv_pages=56,
            weight_pages_by_bits={4: 96, 8: 160}, fixed_resident_bytes=123456,
        )
        return inference_pb2.EngineStats(
            running_requests=running, waiting_requests=0, kv_blocks_used=7, kv_blocks_free=41, kv_block_size=16,
            generated_tokens_total=0, prompt_tokens_total=0, preemptions_total=3,
            finished_requests_total=finished + aborted, aborted_requests_total=aborted, arena=arena, steps_total=9,
            kernel_compiles_total=2,
        )


class FakeDataplane:
    """Start with `start()` (returns "127.0.0.1:PORT"), stop with `stop()`.
    `delay_s`, `tokens_per_message`, `fail_with`, `cached_fraction` (the
    share of each prompt reported as taken from the prefix cache) and
    `drop_after_tokens` (calls end with UNAVAILABLE, as when the connection
    to a crashed dataplane is lost: the next call after its first entry's
    count of tokens, then the next after the second's, ...) may be changed
    while running."""

    def __init__(
        self, tokenizer: Tokenizer, context_length: int = 256, chat_template: str = CHAT_TEMPLATE, port: int = 0
    ) -> None:
        self.port = port
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.chat_template = chat_template
        self.delay_s = 0.0
        self.tokens_per_message = 1
        self.fail_with: grpc.StatusCode | None = None
        self.cached_fraction = 0.0
        self.drop_after_tokens: list[int] = []
        self.state = FakeState()
        self.address = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, name="fake-dataplane", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("fake dataplane did not start")
        return self.address

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = grpc.aio.server()
        inference_pb2_grpc.add_InferenceServicer_to_server(FakeInference(self), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self.address = f"127.0.0.1:{port}"
        self._ready.set()
        await self._stop.wait()
        await server.stop(grace=None)

    def snapshot(self) -> tuple[list[inference_pb2.GenerateRequest], set[str], list[str], list[str]]:
        with self.state.lock:
            return list(self.state.requests), set(self.state.active), list(self.state.aborted), list(self.state.finished)

    def wait_until(self, predicate, timeout_s: float = 5.0) -> bool:
        """Polls `predicate(self)` until true or timeout; returns the last value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return bool(predicate(self))
