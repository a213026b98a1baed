"""GET and POST /lora-adapters, as llama-server's: the adapters a model is
served with and the scales requests without a ``lora`` field run with
(serving/lora.py). ``?model=`` picks the model (default: the default one)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from .errors import ApiError
from .fields import parse_json, read_body


def routes(runtime) -> APIRouter:
    router = APIRouter()

    @router.get("/lora-adapters")
    async def list_adapters(request: Request):
        loras = await run_in_threadpool(runtime.loras, request.query_params.get("model"))
        return JSONResponse(loras.describe())

    @router.post("/lora-adapters")
    async def set_scales(request: Request):
        entries = parse_json(await read_body(request))
        try:
            loras = await run_in_threadpool(runtime.set_lora_scales, request.query_params.get("model"), entries)
        except ValueError as err:
            raise ApiError(400, str(err), param="lora") from None
        return JSONResponse(loras.describe())

    return router
