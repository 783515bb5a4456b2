"""The AdmissionReview exchange: the request read into shape-checked data, the decision, the reply.

The rules see only a `Request` and answer only a `Decision`: the apiserver's bytes are read and its JSON
written here alone, so a body that is not an AdmissionReview never reaches a rule.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufrac.admission import shapes
from gpufrac.contract.errors import brief
from gpufrac.kubeapi import fields

API_VERSION = "admission.k8s.io/v1"


@dataclass(frozen=True)
class Request:
    """The fields of an AdmissionRequest the rules read, shape-checked."""

    uid: str
    operation: str
    resource: str
    sub_resource: str
    namespace: str
    name: str
    user: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None

    @property
    def target(self) -> str:
        """`namespace/name` of the object for logs; a pod created with generateName has no name yet."""
        meta = shapes.metadata_of(self.object or self.old_object)
        name = (
            self.name
            or fields.as_str(meta.get("name"))
            or (fields.as_str(meta.get("generateName")) + "<generated>")
        )
        return f"{self.namespace}/{name}" if self.namespace else name


@dataclass(frozen=True)
class Decision:
    """Allowed or not; why not (`message`, and `rule` for the metrics); the JSONPatch of a mutation."""

    allowed: bool
    message: str = ""
    rule: str = ""
    patch: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    code: int = 403


ALLOW = Decision(allowed=True)


class MalformedReview(ValueError):
    """A body that is not an AdmissionReview; `uid` is the request's uid where one could be read."""

    def __init__(self, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.uid = uid


def deny(rule: str, message: str) -> Decision:
    return Decision(allowed=False, message=message, rule=rule)


def who(user: str) -> str:
    """The requesting user as a denial names them."""
    return f'"{user}"' if user else "an anonymous user"


def malformed(error: MalformedReview) -> Decision:
    """The answer to a body that is not an AdmissionReview: denied, as the webhook fails closed."""
    return Decision(False, f"malformed AdmissionReview: {error}", "malformed", code=400)


def busy(slots: int) -> Decision:
    """The answer to a review refused unread, while `slots` large ones are read or decided: denied, as the
    webhook fails closed; the apiserver, finding no uid in it, applies the webhook's failurePolicy."""
    return Decision(False, f"the webhook is busy with {slots} large reviews; try again", "busy", code=429)


def missing_object(request: Request) -> str | None:
    """The object field (`object`, `oldObject`) the request's operation needs but lacks, if any."""
    if request.operation in ("CREATE", "UPDATE") and request.object is None:
        return "object"
    if request.operation in ("UPDATE", "DELETE") and request.old_object is None:
        return "oldObject"
    return None


# The most JSON values a review may hold, counted before it is parsed (`json_values`). Parsed, a value
# costs up to about 60 bytes however small its text (`{},` is three bytes and a 64-byte dict), so an 8 MiB
# body of empty objects took 200 MiB, most of the memory the chart gives the webhook: a million values take
# at most about 60 MiB. A real review is far from it: the apiserver stores no object over 1.5 MiB, and a
# review holds two at most.
MAX_JSON_VALUES = 1_000_000


# A JSON string, escapes and all, or one never closed, to the end of the text: each attempt to match then
# succeeds in one pass. Closed only by a quote, an unclosed string made every later quote start a scan to the
# end, and a hostile body of quotes cost the square of its length.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)


def json_values(body: bytes) -> int:
    """At least the number of values and keys in the JSON text `body`: each but the first follows a comma
    or a colon, or opens an object or array. Not counting inside strings: a ConfigMap of CSV under the
    1 MiB an object may hold has a million commas, and its updates must pass."""
    outside = _JSON_STRING.sub(b'""', body)
    return sum(outside.count(mark) for mark in (b",", b":", b"{", b"[")) + 1


def read_review(body: bytes) -> Request:
    """The AdmissionRequest in `body`; MalformedReview if it is not JSON or not shaped like one, or holds
    more values than `MAX_JSON_VALUES`, refused before it is parsed."""
    if (values := json_values(body)) > MAX_JSON_VALUES:
        raise MalformedReview(
            f"{values:,} JSON values or more, over the {MAX_JSON_VALUES:,} a review may hold"
        )
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MalformedReview(f"not JSON ({type(error).__name__})") from None
    if not isinstance(review, dict):
        raise MalformedReview("not a JSON object")
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview('no "request" object')
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview('"request.uid" is missing or not a string')
    strings = {}
    for name in ("operation", "namespace", "name", "subResource"):
        value = request.get(name, "")
        if not isinstance(value, str):
            raise MalformedReview(f'"request.{name}" is not a string', uid)
        strings[name] = value
    if strings["operation"] not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise MalformedReview(f'"request.operation" is {brief(repr(strings["operation"]))}', uid)
    resource = request.get("resource")
    if not isinstance(resource, dict) or not isinstance(resource.get("resource"), str):
        raise MalformedReview('"request.resource.resource" is missing', uid)
    group = resource.get("group", "")
    if not isinstance(group, str):  # read as another resource, no rule would guard the object
        raise MalformedReview('"request.resource.group" is not a string', uid)
    user_info = request.get("userInfo", {})
    user = user_info.get("username", "") if isinstance(user_info, dict) else None
    if not isinstance(user, str):
        raise MalformedReview('"request.userInfo.username" is not a string', uid)
    objects = []
    for name in ("object", "oldObject"):
        value = request.get(name)
        if value is not None and not isinstance(value, dict):
            raise MalformedReview(f'"request.{name}" is not an object', uid)
        objects.append(value)
    return Request(
        uid=uid,
        operation=strings["operation"],
        # Only core resources are guarded; anything else routed here is let through.
        resource=resource["resource"] if group == "" else f"{resource['resource']}.{group}",
        sub_resource=strings["subResource"],
        namespace=strings["namespace"],
        name=strings["name"],
        user=user,
        object=objects[0],
        old_object=objects[1],
    )


# The Kubernetes `Status.reason` of each code a denial carries (metav1.StatusReason); 403 otherwise.
STATUS_REASONS = {400: "BadRequest", 429: "TooManyRequests", 500: "InternalError"}


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview v1 reply: uid, allowed, the denial's status, the base64 JSONPatch.

    Every body gets one, even garbage (with the uid where one could be read), so the apiserver always
    reads an answer and the denial's message, never a bare HTTP error.
    """
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        reason = STATUS_REASONS.get(decision.code, "Forbidden")
        response["status"] = {"code": decision.code, "reason": reason, "message": decision.message}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(decision.patch)).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
