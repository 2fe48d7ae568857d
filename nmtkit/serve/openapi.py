"""The OpenAPI 3.1 description of ``nmt-serve``'s routes (``GET /openapi.json``), its decoding options written from
the fields of :class:`nmtkit.translate.config.DecodeConfig`: their types, defaults and the help ``nmt-translate``
shows, so the schema and the command line cannot disagree; and the routes themselves (:data:`ENDPOINTS`), from
which both the server's routes and the schema's paths are made."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from nmtkit import __version__
from nmtkit.serve.config import ServeConfig

_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def _error(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


@dataclass(frozen=True)
class Endpoint:
    """One route of the server: its path, method, the name of its handler in :func:`nmtkit.serve.app.make_app`,
    and what the schema says of it (``responses`` is given ``json_of``, which names a schema's JSON body)."""

    path: str
    method: str
    handler: str
    summary: str
    responses: Callable[[Callable], dict]
    request: str | None = None  # the schema of its JSON body, if it takes one


# the server's routes, from which both Starlette's routes (app.py) and the schema's paths are made
ENDPOINTS = (
    Endpoint("/", "get", "index", "A page to translate with, drawing the soft alignments",
             lambda j: {"200": {"description": "text/html"}}),
    Endpoint("/health", "get", "health", "Ready or not", lambda j: {
        "200": {"description": "{\"status\": \"ok\"}: loaded and warmed up"},
        "503": {"description": "{\"status\": \"loading\"}, with Retry-After"}}),
    Endpoint("/models", "get", "models", "What is loaded", lambda j: {
        "200": {"description": "architecture, languages, config, vocabulary sizes, preprocessing, updates"},
        "503": _error("still loading")}),
    Endpoint("/openapi.json", "get", "openapi", "This schema", lambda j: {"200": {"description": "OpenAPI 3.1"}}),
    Endpoint("/translate", "post", "translate", "Translate lines", lambda j: {
        "200": {"description": "One result per line, in order", "content": j("Translations")},
        "400": _error("malformed JSON, a wrong type or an unknown or bad option"),
        "413": _error("too many lines or characters, or more than a limit on what a request may cost allows (the "
                      "server's --max-beam, --max-nbest, --max-target-len, --max-attention-cells)"),
        "503": _error("loading, or the queue is full (Retry-After)"),
        "504": _error("no translation within the timeout")}, request="Request"),
)


def paths(json_of: Callable[[str], dict]) -> dict:
    """The schema's paths, one per endpoint."""
    out: dict = {}
    for e in ENDPOINTS:
        operation = {"summary": e.summary, "responses": e.responses(json_of)}
        if e.request is not None:
            operation["requestBody"] = {"required": True, "content": json_of(e.request)}
        out.setdefault(e.path, {})[e.method] = operation
    return out


def schema(cfg: ServeConfig) -> dict:
    from nmtkit.translate.config import DecodeConfig, field_kind

    options = {}
    for f in dataclasses.fields(DecodeConfig):
        kind = _TYPES[field_kind(f.name)]
        # (the default a request gets: the checkpoint's saved one, else the built-in one)
        default = cfg.decoding_defaults.get(f.name, f.default)
        options[f.name] = {"type": [kind, "null"] if f.default is None else kind, "default": default,
                           "description": f.metadata["help"]}
        if f.metadata["choices"]:
            options[f.name]["enum"] = list(f.metadata["choices"])
    request = {
        "type": "object", "required": ["src"], "additionalProperties": False,
        "properties": {
            "src": {"type": "array", "items": {"type": "string"}, "maxItems": cfg.max_lines,
                    "description": f"The lines to translate, one result each, in order (empty lines too); at most "
                                   f"{cfg.max_lines} lines and {cfg.max_chars} characters a request, prefixes "
                                   f"included; beam at most {cfg.max_beam}, nbest {cfg.max_nbest}, "
                                   f"{cfg.max_target_len} target tokens a line."},
            "prefix": {"type": "array", "items": {"type": "string"},
                       "description": "One target prefix per line (\"\": none): each translation starts with it, "
                                      "as given (nmt-translate --prefix)."},
            "alignment": {"type": "boolean", "default": False,
                          "description": "Give each line its word alignment (Pharaoh i-j)."},
            "attention": {"type": "boolean", "default": False,
                          "description": "Give each line its soft alignment over words: the source's tokenised "
                                         "words and the target's words (</s> last on both), the weights a row per "
                                         "target word, summing to 1."},
            "terms": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                      "description": "Glossary entries, [source term, target term, more variants...], added to "
                                     "the server's --terms: each source term found in a line must appear in its "
                                     "translation (nmt-translate --terms; needs beam >= 2)."},
            **options,
        },
    }
    result = {
        "type": "object", "required": ["tgt", "score"],
        "properties": {
            "tgt": {"type": "string", "description": "The translation, as nmt-translate writes it."},
            "score": {"type": "number", "description": "Its log-probability under the model(s)."},
            "nbest": {"type": "array", "description": "With nbest > 1: the n best, best first.",
                      "items": {"type": "object", "properties": {
                          "tgt": {"type": "string"}, "score": {"type": "number"},
                          "ranking_score": {"type": "number"}, "length": {"type": "integer"}}}},
            "alignment": {"type": "string", "description": "Pharaoh links, e.g. \"0-0 1-2\"."},
            "terms": {"type": "object", "description": "With a glossary: the source terms found in the line that "
                                                       "its translation used, and those it missed.",
                      "properties": {"used": {"type": "array", "items": {"type": "string"}},
                                     "missed": {"type": "array", "items": {"type": "string"}}}},
            "attention": {"type": "object", "properties": {
                "src": {"type": "array", "items": {"type": "string"}},
                "tgt": {"type": "array", "items": {"type": "string"}},
                "weights": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}},
        },
    }
    json_of = lambda ref: {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}  # noqa: E731
    return {
        "openapi": "3.1.0",
        "info": {"title": "nmt-serve", "version": __version__,
                 "description": "nmtkit's translation server: RNNsearch / RNNencdec over HTTP, batching the lines of "
                                "concurrent requests."},
        "paths": paths(json_of),
        "components": {"schemas": {
            "Request": request, "Result": result,
            "Translations": {"type": "object", "properties": {
                "translations": {"type": "array", "items": {"$ref": "#/components/schemas/Result"}}}},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        }},
    }
