"""The CLI's side of a plan deployment: POST the graph to `<api>/api/v1/plan` and read the card back.

    response = request_plan("http://127.0.0.1:8000", graph, base=None, target="m.py:Net", source="m.py",
                            options=PlanOptions(), api_key=None, share=False, schema=None)
    response["card"], response["plan"], response.get("shareUrl")

The request body is `{"graph", "base", "target", "source", "options", "share"}` (`source`: the
file or module the card names; the graph, as the CLI sends it (neurarch_graph.outgoing_graph),
carries layer types, shapes and hyperparameters: no weights, no source), plus `"schema"` only with
`--share --share-source`:
the model's schema file document (the lowered forward with its variable names, source text, shapes
and dtypes; no weights), which the deployment shows in the inspector's page of the share. `api_key` is sent as
`Authorization: Bearer <key>` (it lifts the server's per-IP rate limit). The HTTP timeout is
`API_TIMEOUT` (30 s). Every failure, a network error, a rate limit (429), a server error or an
answer that is not a plan, raises `PlanAPIError` with one line that says what happened.

Depends on the standard library, plan (options) and schema.errors.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Optional

from ..schema.errors import NNSchemaError
from .plan import PlanOptions

__all__ = ["API_TIMEOUT", "PLAN_PATH", "PlanAPIError", "request_plan", "plan_url"]

API_TIMEOUT = 30.0
PLAN_PATH = "/api/v1/plan"
_MAX_ANSWER = 16 * 1024 * 1024


class PlanAPIError(NNSchemaError):
    """The plan deployment could not be reached or did not answer with a plan (one line: what happened)."""


def plan_url(api: str) -> str:
    """`http://host:port` (or a URL ending in /api/v1/plan already) -> the plan endpoint."""
    base = api.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise PlanAPIError(f"the API address {api!r} must start with http:// or https://")
    return base if base.endswith(PLAN_PATH) else base + PLAN_PATH


def _server_message(body: bytes) -> str:
    try:
        data = json.loads(body.decode("utf-8", "replace"))
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            return data["error"].splitlines()[0] if data["error"] else ""
    except ValueError:
        pass
    return body.decode("utf-8", "replace").strip().splitlines()[0][:200] if body.strip() else ""


def request_plan(api: str, graph: dict[str, Any], *, base: Optional[dict[str, Any]] = None,
                 target: Optional[str] = None, source: Optional[str] = None, options: Optional[PlanOptions] = None,
                 api_key: Optional[str] = None, share: bool = False, schema: Optional[dict[str, Any]] = None,
                 timeout: float = API_TIMEOUT) -> dict[str, Any]:
    """POST the graph for a plan; return the server's answer (`card`, `plan`, and `shareUrl` when shared).
    `schema` (a schema file document) is sent only with `share`."""
    url = plan_url(api)
    payload = {"graph": graph, "base": base, "target": target, "source": source,
               "options": (options or PlanOptions()).as_json(), "share": bool(share)}
    if share and schema is not None:
        payload["schema"] = schema
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            raw = answer.read(_MAX_ANSWER + 1)
    except urllib.error.HTTPError as exc:
        detail = _server_message(exc.read(64 * 1024))
        if exc.code == 429:
            what = "rate limited (HTTP 429); set NEURARCH_API_KEY to lift the per-IP limit"
        elif exc.code == 413 and "schema" in payload:
            what = "refused the request as too large (HTTP 413; without --share-source the graph is sent without its schema)"
        elif exc.code >= 500:
            what = f"server error (HTTP {exc.code})"
        else:
            what = f"refused the request (HTTP {exc.code})"
        raise PlanAPIError(f"{url}: {what}" + (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PlanAPIError(f"{url}: network failure: {reason}") from None
    if len(raw) > _MAX_ANSWER:
        raise PlanAPIError(f"{url}: the answer is larger than {_MAX_ANSWER} bytes")
    try:
        data = json.loads(raw)
    except ValueError:
        raise PlanAPIError(f"{url}: the answer is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("card"), str) or not isinstance(data.get("plan"), dict):
        raise PlanAPIError(f"{url}: the answer has no card and plan")
    if share and not isinstance(data.get("shareUrl"), str):
        raise PlanAPIError(f"{url}: the graph was not shared (no shareUrl in the answer)")
    return data
