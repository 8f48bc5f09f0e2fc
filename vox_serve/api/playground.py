"""GET /: the playground, one static page that speaks through /v1/audio/speech and saves voices through
/v1/audio/voices (the same routes any client uses); it reports what it received in `window.voxStats`."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from starlette.responses import HTMLResponse

router = APIRouter()
PAGE = resources.files("vox_serve.api").joinpath("static/playground.html")


@router.get("/", summary="The playground page", response_class=HTMLResponse, include_in_schema=False)
async def playground() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers={"cache-control": "no-cache"})
