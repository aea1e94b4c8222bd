"""``/docs``: the API's interactive page, Swagger UI, served from the files of the
``swagger-ui-bundle`` package (a dependency of the ``http`` extra), never from a CDN.

The page, its script and Swagger UI's files need no token, as ``/openapi.json`` needs none:
they show what that public document says and nothing else. "Try it out" sends the token the
user gives to Swagger UI's Authorize, as any client would.

Swagger UI's files are served under a path that names their version
(``/docs/swagger-ui-4.15.5/swagger-ui-bundle.js``), so a browser may keep them for a year:
an upgrade changes the path. The page and its script are revalidated on every load. Each is
read from the package once, on its first request, and kept.
"""

from __future__ import annotations

from pathlib import Path

from delayq.http.problems import Problem
from delayq.http.wire import Reply

# What Swagger UI's files are served as; the page needs no other of the package's files.
VENDOR = {
    "swagger-ui-bundle.js": b"text/javascript; charset=utf-8",
    "swagger-ui.css": b"text/css; charset=utf-8",
    "favicon-32x32.png": b"image/png",
    "favicon-16x16.png": b"image/png",
}
FOREVER = "public, max-age=31536000, immutable"  # (the path names the version)
ALWAYS_CHECK = "no-cache"
# Nothing but this origin: a page that asked a CDN (or Swagger UI's online validator) for
# anything would be refused by the browser. Swagger UI sets style attributes and draws its
# icons from data: URLs.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)

# Relative URLs: the page works wherever the API is mounted (app.mount("/delayq", ...)).
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>delayq HTTP API</title>
<link rel="stylesheet" href="docs/{vendor}/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/{vendor}/favicon-32x32.png" sizes="32x32">
<link rel="icon" type="image/png" href="docs/{vendor}/favicon-16x16.png" sizes="16x16">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/{vendor}/swagger-ui-bundle.js"></script>
<script src="docs/init.js"></script>
</body>
</html>
"""

# Swagger UI 4 (swagger-ui-bundle's) renders OpenAPI 3.0 documents only, and the API's is
# 3.1: the page loads it and hands Swagger UI the 3.0 spelling of the few 3.1 forms it uses
# (a list of types, const). The API is called at the page's own base, where it is served.
INIT = """"use strict";
(function () {
  var base = new URL(".", window.location.href);
  function to30(node) {
    if (Array.isArray(node)) return node.map(to30);
    if (node === null || typeof node !== "object") return node;
    var out = {};
    Object.keys(node).forEach(function (k) { out[k] = to30(node[k]); });
    if (Array.isArray(out.type)) {
      var types = out.type.filter(function (t) { return t !== "null"; });
      if (types.length < out.type.length) out.nullable = true;
      if (types.length === 1) {
        out.type = types[0];
      } else {
        delete out.type;
        out.oneOf = types.map(function (t) { return { type: t }; });
      }
    }
    if ("const" in out) { out["enum"] = [out["const"]]; delete out["const"]; }
    return out;
  }
  fetch(new URL("openapi.json", base), { headers: { accept: "application/json" } })
    .then(function (r) {
      if (!r.ok) throw new Error("GET openapi.json answered " + r.status);
      return r.json();
    })
    .then(function (doc) {
      var spec = to30(doc);
      spec.openapi = "3.0.3";
      spec.servers = [{ url: base.href.replace(/\\/$/, "") }];
      window.ui = SwaggerUIBundle({
        spec: spec,
        dom_id: "#swagger-ui",
        deepLinking: true,
        validatorUrl: null,
        tryItOutEnabled: false,
        persistAuthorization: false
      });
    })
    .catch(function (e) {
      document.getElementById("swagger-ui").textContent =
        "The API's OpenAPI document could not be loaded: " + e.message;
    });
})();
"""

_MISSING = (
    "the interactive page needs the swagger-ui-bundle package, which the http extra "
    "installs: pip install 'delayq[http]'"
)


class Docs:
    """The page, its script and Swagger UI's files, each read once and kept."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._files: dict[str, bytes] = {}

    def _vendor(self) -> Path:
        if self._root is None:
            try:
                import swagger_ui_bundle  # (the http extra's)
            except ImportError:
                raise Problem("not-found", _MISSING) from None
            self._root = Path(str(swagger_ui_bundle.swagger_ui_path))
        return self._root

    @property
    def version_dir(self) -> str:
        """The folder of Swagger UI's files, named with its version: ``swagger-ui-4.15.5``."""
        return self._vendor().name

    def page(self) -> Reply:
        body = self._files.get("")
        if body is None:
            body = self._files[""] = PAGE.format(vendor=self.version_dir).encode()
        return _reply(body, b"text/html; charset=utf-8", ALWAYS_CHECK, POLICY)

    def asset(self, name: str) -> Reply:
        """``init.js``, the page's script; ``/docs/`` is sent to ``/docs``; any other name
        is not here (404)."""
        if name == "":
            return Reply(308, headers={"location": "../docs"})
        if name == "init.js":
            return _reply(INIT.encode(), b"text/javascript; charset=utf-8", ALWAYS_CHECK)
        raise _no_file(f"/docs/{name}")

    def vendor(self, folder: str, name: str) -> Reply:
        """One of Swagger UI's files, from the folder of the version installed."""
        media = VENDOR.get(name)
        if media is None or folder != self.version_dir:
            raise _no_file(f"/docs/{folder}/{name}")
        body = self._files.get(name)
        if body is None:
            body = self._files[name] = (self._vendor() / name).read_bytes()
        return _reply(body, media, FOREVER)


def _reply(body: bytes, media: bytes, cache: str, policy: str | None = None) -> Reply:
    reply = Reply(200)
    reply.body = body
    reply.media = media
    reply.headers = {"cache-control": cache, "x-content-type-options": "nosniff"}
    if policy:
        reply.headers["content-security-policy"] = policy
    return reply


def _no_file(path: str) -> Problem:
    return Problem(
        "not-found",
        f"no file {path}: the interactive page is /docs, and it names the files it loads",
    )
