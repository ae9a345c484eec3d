"""The row of a generation request the upstream refused or failed (or could not be reached for), as the
replica's own server writes it (engine/serving/server/rejections.py builds both): the status the client got,
the upstream's status and its error body, the error code of telemetry/contract/outcomes.py, and for a
length refusal the prompt length and the limit as vLLM's message states them."""

from __future__ import annotations

from engine.serving.server.rejections import refused_record


def upstream_refusal(scope, *, replica_id: str, model_name: str, request_id: str, status: int,
                     upstream_status: int | None, body: bytes, arrival: float, finish: float,
                     detail: dict | None = None):
    """The row of a request the proxy answered `status` because its upstream answered `upstream_status`
    (0: unreachable; None: never asked, the client was gone before its body came) with `body`; a length
    refusal's numbers come from its message (rejections.length_numbers) where `detail` has none."""
    return refused_record(scope, replica_id=replica_id, model_name=model_name, status=status, body=body,
                          arrival=arrival, finish=finish, request_id=request_id, upstream_status=upstream_status,
                          detail=detail)
