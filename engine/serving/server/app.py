"""The OpenAI-compatible HTTP server of one replica (FastAPI).

Routes: POST /v1/completions, POST /v1/chat/completions (SSE when
`stream`), GET /v1/models, GET /health, GET|HEAD /metrics (the engine's metrics plus the
standard process_* ones), GET /version, POST /tokenize and POST /detokenize (as vLLM has
them: what a prompt or a conversation becomes, and the context length; the text of token IDs).
Each generation request ends with an `infersight.access` log line (server_log.py).

A request's life here: headers -> RequestContext (id, workload, trace
context); a full replica refuses it at once (429 + Retry-After, load_shedding.py);
body -> admission on a worker thread (a Prompt, tokenized there once, +
SamplingParams, or a 400), so a long prompt never stalls the event loop; the
engine generates; outputs -> OpenAI JSON or SSE chunks. A client that goes away
aborts its request, so the engine frees its KV blocks at once (and /metrics,
read from the engine's live state at every scrape, shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from engine.serving.server.admission import Admitted, admit_chat, admit_completion, detokenize, tokenize
from engine.serving.server.body_limit import BodyLimitMiddleware
from engine.serving.server.choices import merged
from engine.serving.server.errors import APIError, install_error_handlers, sse_error
from engine.serving.server.formatting import (
    GroupStreamFormatter, ResponseOptions, StreamFormatter, full_response, with_choices,
)
from engine.serving.server.headers import REQUEST_ID_HEADER, RequestContext, request_context
from engine.serving.server.load_shedding import RETRY_AFTER_SECONDS, LoadShedder, default_max_queue
from engine.serving.server.model_info import ServedModel
from engine.serving.server.openapi import install_openapi
from engine.serving.server.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse, DetokenizeRequest,
    DetokenizeResponse, ErrorResponse, Health, ModelList, ServerLoad, TokenizeRequest, TokenizeResponse,
    VersionResponse,
)
from engine.serving.server.rejections import ENGINE_ROW, RefusalRecorder
from engine.serving.server.request_id import RequestIdMiddleware
from engine.serving.server.server_log import log_access
from engine.serving.server.tool_calls import tool_response
from engine.serving.server.tool_stream import ToolStream
from engine.serving.server.version import package_version
from telemetry.metrics.collectors import register_process_collector

log = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"
MAX_BODY_BYTES = 32 << 20  # a million-token prompt as JSON is about 7 MB
_ERRORS = {400: {"model": ErrorResponse, "description": "invalid request"},
           401: {"model": ErrorResponse, "description": "missing or wrong API key"}}
# the routes that name a model
_MODEL_ERRORS = {**_ERRORS, 404: {"model": ErrorResponse, "description": "the model is not served here "
                                                                         "(code model_not_found)"}}
_GENERATION_ERRORS = {**_MODEL_ERRORS,
                      409: {"model": ErrorResponse, "description": "a request with this X-Request-Id is in flight"},
                      413: {"model": ErrorResponse, "description": "request body too large"},
                      429: {"model": ErrorResponse, "description": "the replica's queue is full (see Retry-After)",
                            "headers": {"Retry-After": {"description": "seconds to wait before retrying",
                                                        "schema": {"type": "integer"}}}},
                      503: {"model": ErrorResponse, "description": "the engine is shutting down or failed"}}
# each server-sent event: `data: <a JSON chunk>` (a completion / chat.completion chunk, or an error), then
# `data: [DONE]`
_STREAM = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk, or [DONE] at the end"}}}}}


class Server:
    """State shared by the routes: the engine, the requests in flight, the bound on them."""

    def __init__(self, served: ServedModel, metrics_registry=None, max_queue: int | None = None,
                 metrics_observer=None):
        self.served = served
        self.registry = metrics_registry
        self.metrics_observer = metrics_observer  # telemetry.metrics.MetricsObserver: its gauges, set at scrape
        self.in_flight: dict[str, float] = {}  # request id -> arrival (duplicates are refused)
        self.admitting = 0  # requests between the capacity check and the engine (tokenizing on a thread)
        self.shedder = LoadShedder(served.max_num_seqs, default_max_queue(served.max_num_seqs)
                                   if max_queue is None else max_queue)

    async def admit(self, admission, body) -> Admitted:
        """Refuse at once when full (429); else run `admission` (it tokenizes) on a worker thread."""
        try:
            self.shedder.check(self.admitting + len(self.in_flight))
        except APIError as e:  # the queue's state in the shed request's row (rejections.py)
            with contextlib.suppress(Exception):
                e.detail.update({k: v for k, v in self.served.engine_state().items() if k in ("running", "waiting")})
            raise
        self.admitting += 1
        try:
            return await anyio.to_thread.run_sync(admission, body, self.served)
        finally:
            self.admitting -= 1

    # -- the generation paths -----------------------------------------------------

    def _start(self, ctx: RequestContext, admitted: Admitted):
        if ctx.request_id in self.in_flight:
            raise APIError(f"a request with id {ctx.request_id!r} is already in flight; request ids must be unique",
                           status=409, param=REQUEST_ID_HEADER, code="duplicate_request_id")
        self.in_flight[ctx.request_id] = time.time()
        if admitted.is_group:  # n > 1, best_of, a list of prompts: several engine requests (choices.py)
            return merged(self.served.engine, admitted.engine_requests(), ctx.request_id,
                          workload=ctx.workload, trace_context=ctx.trace_context)
        return self.served.engine.generate(admitted.engine_prompt, admitted.sampling_params, ctx.request_id,
                                           workload=ctx.workload, trace_context=ctx.trace_context)

    async def _abort(self, request_id: str, gen) -> None:
        # shielded: this runs while the request's task is being cancelled (client gone)
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await self.served.engine.abort(request_id)
            with contextlib.suppress(BaseException):
                await gen.aclose()

    async def generate_full(self, request: Request, ctx: RequestContext, admitted: Admitted, opts: ResponseOptions):
        gen = self._start(ctx, admitted)
        done = False
        started, status, out = time.time(), 500, None
        try:
            collect = asyncio.ensure_future(_last_output(gen))
            gone = asyncio.ensure_future(_client_disconnected(request))
            try:
                await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not collect.done():  # the client left: nobody will read the answer
                collect.cancel()
                with contextlib.suppress(BaseException):
                    await collect
                log.info("client disconnected, aborting %s", ctx.request_id)
                status = 499
                setattr(request.state, ENGINE_ROW, True)  # the engine records the abort
                return Response(status_code=499)
            out = _engine_result(collect)
            done = True
            body = full_response(self.served, opts, out)
            if admitted.tools is not None:  # tool calls parsed out of the content (tool_calls.py)
                body = tool_response(admitted.tools, body)
            response = JSONResponse(body)
            status = 200
            return response
        except APIError as e:
            status = e.status
            if e.code == "engine_error":  # the engine failed it, and wrote its row
                setattr(request.state, ENGINE_ROW, True)
            raise
        except asyncio.CancelledError:  # the task is cancelled (shutdown): the abort below is the engine's row
            setattr(request.state, ENGINE_ROW, True)
            raise
        finally:
            if not done:
                await self._abort(ctx.request_id, gen)
            self.in_flight.pop(ctx.request_id, None)
            log_access(ctx.request_id, status, out, started)

    async def generate_stream(self, request: Request, ctx: RequestContext, admitted: Admitted, opts: ResponseOptions):
        gen = self._start(ctx, admitted)
        started = time.time()
        try:  # the first output comes before the headers, so an admission error is still a clean 400
            first = await gen.__anext__()
        except BaseException as e:
            self.in_flight.pop(ctx.request_id, None)
            if isinstance(e, asyncio.CancelledError):  # the engine had it: its abort is the row
                setattr(request.state, ENGINE_ROW, True)
            await self._abort(ctx.request_id, gen)
            log_access(ctx.request_id, 400 if isinstance(e, ValueError) else 503 if isinstance(e, RuntimeError)
                       else 500, None, started)
            if isinstance(e, StopAsyncIteration):
                raise APIError("the engine produced no output", status=500, type="internal_error") from None
            if isinstance(e, ValueError):
                raise APIError(str(e)) from None
            if isinstance(e, RuntimeError):  # shutting down, or the engine loop died
                raise _unavailable(e) from None
            raise
        formatter = (GroupStreamFormatter(self.served, opts, len(admitted.engine_requests())) if admitted.is_group
                     else StreamFormatter(self.served, opts))
        if admitted.tools is not None:  # content deltas -> tool-call deltas (tool_stream.py)
            formatter = ToolStream(formatter, admitted.tools)
        state = {"finished": first.finished, "last": first, "failed": False}

        async def events():
            try:
                out = first
                if out.finish_reason != "error":
                    for event in formatter.events(first):
                        yield event
                    if not state["finished"]:
                        async for out in gen:
                            state["finished"], state["last"] = out.finished, out
                            if out.finish_reason == "error":
                                break
                            for event in formatter.events(out):
                                yield event
                            if out.finished:
                                break
                if out.finish_reason == "error":  # it failed in the engine, alone: in-band, as vLLM reports it
                    state["failed"] = True
                    yield sse_error(f"generation failed: {out.error}")
                yield SSE_DONE
            except Exception as e:  # headers are gone: report in-band, as OpenAI does
                log.exception("stream of %s failed", ctx.request_id)
                yield sse_error(f"generation failed: {e}")
                yield SSE_DONE

        async def cleanup():  # runs however the response ends: done, client gone, or never started
            if not state["finished"]:
                log.info("stream of %s ended early, aborting", ctx.request_id)
                await self._abort(ctx.request_id, gen)
            self.in_flight.pop(ctx.request_id, None)
            status = 500 if state["failed"] else 200 if state["finished"] else 499
            log_access(ctx.request_id, status, state["last"], started)

        return _StreamWithCleanup(events(), cleanup, media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache"})

    def health(self) -> dict:
        s = self.served
        state = {}
        with contextlib.suppress(Exception):
            state = s.engine_state()
        alive = getattr(s.engine, "is_running", True)
        return {"status": "ok" if alive else "error", "replica_id": s.replica_id, "model": s.name,
                "in_flight": len(self.in_flight), "max_in_flight": self.shedder.limit, **state}

    def refresh_gauges(self) -> None:
        """Queue and KV gauges from the engine's live state: aborts between steps change them too."""
        if self.metrics_observer is None:
            return
        with contextlib.suppress(Exception):  # a monitoring read must never fail the scrape
            self.metrics_observer.fold()  # else the collection's fold would set an older step's state over it
            state, kv = self.served.engine_state(), self.served.kv_state()
            self.metrics_observer.set_engine_state(state["running"], state["waiting"], kv["used"], kv["free"],
                                                   kv["cached"], kv["total"])


class _StreamWithCleanup(StreamingResponse):
    """A StreamingResponse that runs `cleanup` whenever it ends, even if its body never started."""

    def __init__(self, content, cleanup, **kwargs):
        super().__init__(content, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()


async def _last_output(gen):
    last = None
    async for out in gen:
        last = out
        if out.finished:
            break
    return last


def _unavailable(e: RuntimeError) -> APIError:
    return APIError(f"the engine cannot serve: {e}", status=503, type="service_unavailable",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _engine_result(task: asyncio.Future):
    try:
        out = task.result()
    except ValueError as e:  # admission errors the engine found (our own checks came first)
        raise APIError(str(e)) from None
    except RuntimeError as e:  # the engine is shutting down or its loop died
        raise _unavailable(e) from None
    if out is None:
        raise APIError("the engine produced no output", status=500, type="internal_error")
    if out.finish_reason == "error":
        raise APIError(f"generation failed: {out.error}", status=500, type="internal_error", code="engine_error")
    return out


async def _client_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _bearer_check(api_key: str):
    bearer = HTTPBearer(auto_error=False, description="the server's --api-key")

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)):
        given = credentials.credentials if credentials is not None else ""
        if not secrets.compare_digest(given.encode(), api_key.encode()):
            raise APIError("invalid or missing API key: send 'Authorization: Bearer <key>'", status=401,
                           code="invalid_api_key")

    return check


def build_app(served: ServedModel, *, api_key: str | None = None, metrics_registry=None,
              manage_engine: bool = True, max_queue: int | None = None, metrics_observer=None,
              stats=None) -> FastAPI:
    """The app for one replica. With `manage_engine`, startup starts the engine and shutdown stops it.

    max_queue: requests that may wait beyond the `max_num_seqs` running before new ones get 429
    (default: load_shedding.default_max_queue). metrics_observer: the MetricsObserver on
    `metrics_registry`, whose queue and KV gauges each scrape sets from the engine's live state.
    stats: a server_log.StatsLogger, run while the app serves (the periodic stats line)."""
    server = Server(served, metrics_registry, max_queue, metrics_observer)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine:
            served.engine.start()
        ticker = asyncio.ensure_future(stats.run()) if stats is not None else None
        try:
            yield
        finally:
            if ticker is not None:
                ticker.cancel()
            if manage_engine:
                await served.engine.shutdown()

    app = FastAPI(title="infersight replica", version="0.1.0", lifespan=lifespan,
                  max_body_size=2 * MAX_BODY_BYTES,  # backstop for chunked bodies; BodyLimitMiddleware answers first
                  strict_content_type=False,  # `curl -d` sends form content-type: read the body as JSON anyway
                  description="OpenAI-compatible completions and chat completions of one infersight replica.")
    app.state.server = server
    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_BODY_BYTES)
    # every refused generation request is a row (rejections.py): outside all that refuses, inside the id
    app.add_middleware(RefusalRecorder, observer=getattr(getattr(served.engine, "engine", None), "observer", None),
                       replica_id=served.replica_id, model_name=served.name)
    app.add_middleware(RequestIdMiddleware)  # outermost: even a refused request gets its id back
    install_error_handlers(app)
    auth = [Depends(_bearer_check(api_key))] if api_key else []

    def options(kind: str, req, ctx: RequestContext, logprobs) -> ResponseOptions:
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        return ResponseOptions(
            kind=kind, response_id=f"{prefix}-{ctx.request_id}", created=int(time.time()), model=served.name,
            return_token_ids=req.return_token_ids, return_metrics=req.return_metrics, logprobs=logprobs,
            include_usage=bool(req.stream_options and req.stream_options.include_usage))

    @app.post("/v1/completions", dependencies=auth, response_model=CompletionResponse,
              responses={**_GENERATION_ERRORS, 200: {"content": _STREAM}}, tags=["openai"])
    async def completions(body: CompletionRequest, request: Request):
        ctx = request_context(request.headers, "text_completion")
        admitted = await server.admit(admit_completion, body)
        opts = with_choices(options("completion", body, ctx, body.logprobs), served, admitted, body)
        if body.stream:
            return await server.generate_stream(request, ctx, admitted, opts)
        return await server.generate_full(request, ctx, admitted, opts)

    @app.post("/v1/chat/completions", dependencies=auth, response_model=ChatCompletionResponse,
              responses={**_GENERATION_ERRORS, 200: {"content": _STREAM}}, tags=["openai"])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        ctx = request_context(request.headers, "chat")
        admitted = await server.admit(admit_chat, body)
        opts = with_choices(options("chat", body, ctx, admitted.sampling_params.logprobs), served, admitted, body)
        if body.stream:
            return await server.generate_stream(request, ctx, admitted, opts)
        return await server.generate_full(request, ctx, admitted, opts)

    @app.post("/tokenize", dependencies=auth, response_model=TokenizeResponse, responses=_MODEL_ERRORS,
              tags=["extras"])
    async def tokenize_route(body: TokenizeRequest):
        tokens = await anyio.to_thread.run_sync(tokenize, body, served)
        return {"count": len(tokens), "max_model_len": served.max_model_len, "tokens": tokens}

    @app.post("/detokenize", dependencies=auth, response_model=DetokenizeResponse, responses=_MODEL_ERRORS,
              tags=["extras"])
    async def detokenize_route(body: DetokenizeRequest):
        return {"prompt": await anyio.to_thread.run_sync(detokenize, body, served)}

    @app.get("/version", response_model=VersionResponse, tags=["ops"])
    async def version():
        return {"version": package_version()}

    @app.get("/v1/models", dependencies=auth, response_model=ModelList, responses=_ERRORS, tags=["openai"])
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "infersight", "max_model_len": served.max_model_len,
                                            "root": served.root}]}

    @app.get("/health", response_model=Health, responses={503: {"model": Health}}, tags=["ops"])
    async def health():
        body = server.health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    # vLLM's (SageMaker's) liveness probe: the answer of /health; POST too, as vLLM takes it (not in the
    # schema: a body-less POST has nothing a client could get wrong)
    for method in ("GET", "POST"):
        app.add_api_route("/ping", health, methods=[method], operation_id=f"ping_{method.lower()}",
                          response_model=Health, responses={503: {"model": Health}}, tags=["ops"],
                          include_in_schema=method == "GET")

    @app.get("/load", response_model=ServerLoad, tags=["ops"])
    async def load():
        """vLLM's: the generation requests this server holds now (admitting or in the engine)."""
        return {"server_load": server.admitting + len(server.in_flight)}

    if metrics_registry is not None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        register_process_collector(metrics_registry)  # process_resident_memory_bytes, process_cpu_seconds_total ...
        if getattr(metrics_observer, "vllm_names", False):  # vLLM's http_* series too, its token bounds the model's
            from telemetry.metrics.http_metrics import instrument_http

            instrument_http(app, metrics_registry)
            metrics_observer.set_max_model_len(served.max_model_len)

        @app.get("/metrics", response_class=Response, tags=["ops"],
                 responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
        async def metrics():
            server.refresh_gauges()
            return Response(generate_latest(metrics_registry), media_type=CONTENT_TYPE_LATEST)

        @app.head("/metrics", include_in_schema=False)  # probes (and vLLM's clients) ask HEAD first
        async def metrics_head():
            return Response(media_type=CONTENT_TYPE_LATEST)

    install_openapi(app, served)
    return app
