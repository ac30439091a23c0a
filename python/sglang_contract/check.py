"""Checks an HTTP trace against SGLang 0.5.23's own request and response definitions.

    python python/sglang_contract/check.py TRACE.jsonl

TRACE.jsonl has one JSON object per HTTP exchange (the `trace_requests` file of the sglang
plugin): {"method", "path", "query", "status", "request", "response"}; `query` is the raw query
string (with or without "?"), an object, or null; `request`/`response` are the JSON bodies or
null; a streamed response is the list of its `data:` frames (JSON values, "[DONE]" left out).

Requests: the route is looked up in SGLang's real FastAPI app
(`sglang.srt.entrypoints.http_server.app`), and the body and query are validated by FastAPI's own
`request_body_to_args` / `request_params_to_args` against the route's declared types
(`io_struct` msgspec structs through SGLang's pydantic bridge, extra keys ignored; OpenAI
`protocol` models). `/generate` bodies also go through `generate_contract_error`
(`sglang.api.v1.api_types.GenerateRequest`: unknown `sampling_params` keys rejected), exactly as
SGLang's handler does, and `GenerateReqInput.normalize_batch_and_arguments()` (the tokenizer
manager's first step: one of text / input_ids, batch sizes).

Responses: where SGLang defines the shape as a type (RESPONSE_TYPES below); error bodies
(status >= 400) against SGLang's three error shapes.

Exit 0 with `checked N requests, M responses against sglang 0.5.23`; exit 1 at the first
mismatch, naming the line, the route and the field; exit 2 on a bad trace or command line.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_import import SGLANG_VERSION, import_sglang  # noqa: E402


class Mismatch(Exception):
    """The trace disagrees with SGLang's definitions: `field` names where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# pydantic-core's names for schema steps in an error location (not field names)
_SCHEMA_STEPS = ("function-", "json-or-python", "typed-dict", "is-instance", "union[", "model[")


def _loc(loc: Any) -> str:
    parts = [str(p) for p in (loc or ())]
    if parts and parts[0] in ("body", "query"):
        parts = parts[1:]
    # pydantic puts the union member / function name in the path; keep the field names
    parts = [p for p in parts if not p.startswith(_SCHEMA_STEPS)]
    return ".".join(parts)


def _pydantic_errors(errors: list, what: str) -> None:
    if errors:
        # SGLang's bridge is a union (an instance, or a dict): report the dict branch's error
        real = [e for e in errors if not any(str(p).startswith("is-instance") for p in e["loc"])]
        e = (real or errors)[0]
        loc = _loc(e.get("loc"))
        raise Mismatch(f"{what} field {loc}" if loc else what, e.get("msg", str(e)))


class Contract:
    """SGLang's definitions, imported once."""

    def __init__(self) -> None:
        import warnings

        # SGLang's model layer warns at import that AWQ/GGUF kernels need CUDA: not our concern
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._import()

    def _import(self) -> None:
        import_sglang()
        import pydantic
        from fastapi.dependencies.utils import request_body_to_args, request_params_to_args
        from sglang.api.v1 import api_types
        from sglang.srt.entrypoints import http_server
        from sglang.srt.entrypoints.api_contract import generate_contract_error
        from sglang.srt.entrypoints.openai import protocol
        from sglang.srt.managers import io_struct
        from starlette.routing import Match

        self._pydantic = pydantic
        self._body_to_args = request_body_to_args
        self._params_to_args = request_params_to_args
        self._generate_contract_error = generate_contract_error
        self._match_full = Match.FULL
        self._routes = [r for r in http_server.app.routes if getattr(r, "dependant", None)]
        self.api_types = api_types
        self.protocol = protocol
        self.io_struct = io_struct
        self._adapters: dict = {}

    # ---- requests ----

    def route(self, method: str, path: str):
        scope = {"type": "http", "method": method.upper(), "path": path, "root_path": ""}
        for r in self._routes:
            match, _ = r.matches(scope)
            if match == self._match_full:
                return r
        raise Mismatch("route", f"{method.upper()} {path} is not a route of sglang {SGLANG_VERSION}")

    def check_request(self, method: str, path: str, query: Any, body: Any) -> None:
        from starlette.datastructures import QueryParams

        route = self.route(method, path)
        dep = route.dependant
        if dep.query_params:
            if isinstance(query, dict):
                params = QueryParams([(k, str(v)) for k, v in query.items()])
            else:
                params = QueryParams((query or "").lstrip("?"))
            _, errors = self._params_to_args(dep.query_params, params)
            _pydantic_errors(errors, "query")
        if dep.body_params:
            values, errors = asyncio.run(
                self._body_to_args(dep.body_params, body, route._embed_body_fields)
            )
            _pydantic_errors(errors, "request")
            if route.path == "/generate":
                self._check_generate(body, next(iter(values.values())))

    def _check_generate(self, body: Any, obj: Any) -> None:
        err = self._generate_contract_error(body)
        if err is not None:
            field = self._locate(self.api_types.GenerateRequest, body)
            where = f"request field {field}" if field else "request"
            raise Mismatch(f"{where} (sglang.api.v1.GenerateRequest)", err)
        try:
            copy.deepcopy(obj).normalize_batch_and_arguments()
        except (ValueError, TypeError, AssertionError) as e:
            raise Mismatch("request (GenerateReqInput.normalize_batch_and_arguments)", str(e)) from e

    # ---- responses ----

    def adapter(self, cls: Any):
        if cls not in self._adapters:
            self._adapters[cls] = self._pydantic.TypeAdapter(cls)
        return self._adapters[cls]

    def validate(self, cls: Any, value: Any, what: str = "response") -> None:
        try:
            self.adapter(cls).validate_python(value)
        except self._pydantic.ValidationError as e:
            _pydantic_errors(e.errors(), what)

    def validate_struct(self, cls: Any, value: Any, skip: tuple = ()) -> None:
        """An io_struct output struct, as SGLang's pydantic bridge reads it (extra keys ignored).

        Some output structs hold plain msgspec structs (LoRARef, ChecksumInfo) that pydantic
        has no schema for; then each field is validated on its own, those fields by msgspec.
        """
        import msgspec

        if not skip:
            try:
                return self.validate(cls, value)
            except self._pydantic.PydanticSchemaGenerationError:
                pass
        if not isinstance(value, dict):
            raise Mismatch("response", f"expected an object ({cls.__name__})")
        for f in msgspec.structs.fields(cls):
            if f.name in skip:
                continue
            if f.name not in value:
                if f.required:
                    raise Mismatch(f"response field {f.name}", "Field required")
                continue
            try:
                self.validate(f.type, value[f.name], f"response field {f.name}")
            except self._pydantic.PydanticSchemaGenerationError:
                try:
                    msgspec.convert(value[f.name], f.type)
                except msgspec.ValidationError as e:
                    raise Mismatch(f"response field {f.name}", str(e)) from e

    def api_type(self, cls: Any, value: Any, what: str = "response") -> None:
        try:
            cls.from_json_value(value)
        except self.api_types.JsonContractError as e:
            field = self._locate(cls, value)
            where = f"{what} field {field} ({cls.__name__})" if field else f"{what} ({cls.__name__})"
            raise Mismatch(where, str(e)) from e

    def _locate(self, cls: Any, value: Any) -> str:
        """The key whose value alone fails cls's decoder (its errors name no field), or ""."""
        if not isinstance(value, dict):
            return ""
        nested = {"meta_info": self.api_types.GenerateMetaInfo}  # sampling_params: named by serde
        for key, item in value.items():
            try:
                cls.from_json_value({key: item})
            except self.api_types.JsonContractError:
                inner = nested.get(key)
                sub = self._locate(inner, item) if inner is not None else ""
                return f"{key}.{sub}" if sub else key
        return ""


def _model(name: str) -> Callable[[Contract, Any], None]:
    return lambda c, v: c.validate(getattr(c.protocol, name), v)


def _struct(name: str) -> Callable[[Contract, Any], None]:
    return lambda c, v: c.validate_struct(getattr(c.io_struct, name), v)


def _generate(c: Contract, v: Any) -> None:
    for i, item in enumerate(v if isinstance(v, list) else [v]):
        where = f"response[{i}]" if isinstance(v, list) else "response"
        if not isinstance(item, dict):
            raise Mismatch(where, f"expected an object, got {type(item).__name__}")
        c.api_type(c.api_types.GenerateResponse, item, where)
        if "meta_info" not in item:
            raise Mismatch(f"{where} field meta_info", "missing (SGLang always sends it)")


def _lora(c: Contract, v: Any) -> None:
    # LoRAUpdateOutput goes out through msgspec_to_builtins, so a LoRARef value is an object of
    # LoRARef's fields. pydantic has no schema for LoRARef (a plain msgspec struct): the rest of
    # the struct is validated through SGLang's bridge, each LoRARef by constructing it.
    import msgspec
    from sglang.srt.lora.lora_registry import LoRARef

    c.validate_struct(c.io_struct.LoRAUpdateOutput, v, skip=("loaded_adapters",))
    adapters = v.get("loaded_adapters")
    if adapters is None:
        return
    if not isinstance(adapters, dict):
        raise Mismatch("response field loaded_adapters", "expected an object or null")
    names = {f.name for f in msgspec.structs.fields(LoRARef)}
    for key, ref in adapters.items():
        where = f"response field loaded_adapters.{key}"
        if isinstance(ref, str):
            continue
        if not isinstance(ref, dict):
            raise Mismatch(where, "expected a string or a LoRARef object")
        if not set(ref) <= names:
            raise Mismatch(f"{where}.{sorted(set(ref) - names)[0]}", "not a LoRARef field")
        try:
            LoRARef(**ref)
        except (TypeError, ValueError) as e:
            raise Mismatch(where, f"not a LoRARef: {e}") from e


# path -> (validator of a 200 body, validator of one stream frame or None). Only shapes SGLang
# defines as types; a route not listed here has its response counted as unchecked.
RESPONSE_TYPES: dict = {
    "/generate": (_generate, _generate),
    "/v1/completions": (_model("CompletionResponse"), _model("CompletionStreamResponse")),
    "/v1/chat/completions": (
        _model("ChatCompletionResponse"),
        _model("ChatCompletionStreamResponse"),
    ),
    "/v1/models": (_model("ModelList"), None),
    "/update_weights_from_disk": (_struct("UpdateWeightFromDiskReqOutput"), None),
    "/begin_weight_update": (_struct("BeginWeightUpdateReqOutput"), None),
    "/end_weight_update": (_struct("EndWeightUpdateReqOutput"), None),
    "/init_weights_update_group": (_struct("InitWeightsUpdateGroupReqOutput"), None),
    "/destroy_weights_update_group": (_struct("DestroyWeightsUpdateGroupReqOutput"), None),
    "/update_weights_from_distributed": (_struct("UpdateWeightsFromDistributedReqOutput"), None),
    "/update_weights_from_tensor": (_struct("UpdateWeightsFromTensorReqOutput"), None),
    "/weights_checker": (_struct("CheckWeightsReqOutput"), None),
    "/load_lora_adapter": (_lora, None),
    "/unload_lora_adapter": (_lora, None),
}


def _error_shape(c: Contract, v: Any) -> None:
    """SGLang's error bodies: validation (OpenAI ErrorResponse), handler, /generate contract."""
    if isinstance(v, dict) and v.get("object") == "error":
        return c.validate(c.protocol.ErrorResponse, v)
    if isinstance(v, dict) and isinstance(v.get("error"), str):
        return None  # /generate contract violation: {"error": "<text>"}
    if isinstance(v, dict) and isinstance(v.get("error"), dict):
        if not isinstance(v["error"].get("message"), str):
            raise Mismatch("response field error.message", "missing or not a string")
        return None
    raise Mismatch("response", "not one of SGLang's error shapes")


def check_response(c: Contract, path: str, status: int, request: Any, body: Any) -> bool:
    """Validates `body`; False when SGLang defines no type for it (not counted)."""
    plain, frame = RESPONSE_TYPES.get(path, (None, None))
    if status >= 400:
        if body is None or isinstance(body, str):
            return False  # text / empty error bodies (e.g. /flush_cache) have no type
        if plain is not None:
            try:
                plain(c, body)  # update routes answer 400 with their success=false shape
                return True
            except Mismatch:
                pass
        _error_shape(c, body)
        return True
    if plain is None or body is None:
        return False
    streamed = isinstance(request, dict) and request.get("stream") is True
    if streamed and isinstance(body, list) and frame is not None:
        for i, chunk in enumerate(body):
            if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                if path == "/generate":
                    c.api_type(c.api_types.GenerateStreamError, chunk, f"response frame {i}")
                else:
                    _error_shape(c, chunk)
                continue
            try:
                frame(c, chunk)
            except Mismatch as e:
                raise Mismatch(f"frame {i} {e.field}", e.message) from e
        return True
    plain(c, body)
    return True


def check_trace(path: str, contract: Optional[Contract] = None) -> tuple:
    """(requests checked, responses checked); raises SystemExit(1) at the first mismatch."""
    c = contract or Contract()
    n_req = n_resp = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                method, route = rec["method"], rec["path"].split("?", 1)[0]
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                print(f"{path}:{lineno}: not a trace record ({e})", file=sys.stderr)
                raise SystemExit(2) from e
            where = f"{path}:{lineno}: {method} {route}"
            try:
                c.check_request(method, route, rec.get("query"), rec.get("request"))
                n_req += 1
                status = int(rec.get("status") or 0)
                if check_response(c, route, status, rec.get("request"), rec.get("response")):
                    n_resp += 1
            except Mismatch as e:
                print(f"{where}: {e.field}: {e.message}", file=sys.stderr)
                raise SystemExit(1) from e
    return n_req, n_resp


def main(argv: list) -> int:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    n_req, n_resp = check_trace(argv[1])
    print(f"checked {n_req} requests, {n_resp} responses against sglang {SGLANG_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
