"""The HTML pages (the chat and the sign-in), drawn from `templates/` under one set of headers."""

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")

# Defence in depth for every page: even markup that got past the sanitizer can neither run inline
# script nor load anything from another origin, and no page can be framed (clickjacking).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def render_page(
    request: Request, name: str, context: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return templates.TemplateResponse(
        request, name, context, status_code=status, headers={**PAGE_HEADERS, **(headers or {})}
    )
