"""The page's own files (`/static`) and its libraries (`/vendor`), compressed on the wire and cached as
their names allow.

A library's path names its version (`/vendor/marked@18.2.1/lib/marked.esm.js`): its bytes never change
under that path, so a browser keeps it a year without asking again; a new version is a new path. The
page's own files have no version in their names: a browser keeps them but asks each time whether they
changed (ETag; an unchanged file is a 304 of no body). Both, and the page itself, go gzip-compressed to a
browser that takes it.
Only the library files the page names are served, not the rest of node_modules.
"""

import json
import re
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]
# A library file the page names: its package (a scope and a name, or a name), its version, its path.
VENDOR_PATH = re.compile(r"/vendor/((?:@[\w.-]+/)?[\w.-]+)@([\w.+-]+)/([\w@.+/-]+)")
YEAR = 365 * 24 * 3600
GZIP_FROM_BYTES = 1000  # smaller files gain nothing worth the compressing


def vendor_files(root: Path = ROOT) -> dict[str, str]:
    """The library files the page names (in its template, its scripts and its styles) at the version
    installed in node_modules: their paths under /vendor/, each to its path in node_modules."""
    sources = [
        *root.glob("pocketchat/web/templates/*.html"),
        *root.glob("static/*.html"),
        *root.glob("static/*.js"),
        *root.glob("static/*.css"),
    ]
    named = {match for source in sources for match in VENDOR_PATH.findall(source.read_text())}
    return {
        f"{package}@{version}/{path}": f"{package}/{path}"
        for package, version, path in named
        if installed_version(root / "node_modules" / package) == version
    }


def installed_version(package: Path) -> str | None:
    try:
        return json.loads((package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


class PageFiles(StaticFiles):
    """The page's own files: kept by the browser, asked again each time (`no-cache`: revalidate)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Cache-Control"] = "no-cache"
        return response


class VendorFiles(StaticFiles):
    """The page's library files: an allow-list of versioned paths; anything else is a 404, as if absent
    (another version's path too: never other bytes under a path a browser keeps a year)."""

    def __init__(self, files: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.files = files

    async def get_response(self, path: str, scope: Scope) -> Response:
        if path not in self.files:  # `path` is normalised already: no `..`, no doubled slashes
            raise HTTPException(status_code=404)
        response = await super().get_response(self.files[path], scope)
        response.headers["Cache-Control"] = f"public, max-age={YEAR}, immutable"
        return response


def page_files(root: Path = ROOT) -> ASGIApp:
    return PageFiles(directory=root / "static")


def library_files(root: Path = ROOT) -> ASGIApp:
    return VendorFiles(vendor_files(root), directory=root / "node_modules", check_dir=False)


class CompressPage:
    """ASGI middleware: gzip for the page and its files (`/`, `/static/`, `/vendor/`), not for the API,
    whose answers hold a secret (a share link's token) beside text a user chose: compressed together, their
    sizes would tell an eavesdropper the secret a guess at a time (BREACH)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=GZIP_FROM_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        page = scope["type"] == "http" and (scope["path"] == "/" or scope["path"].startswith(("/static/", "/vendor/")))
        await (self.gzip if page else self.app)(scope, receive, send)
