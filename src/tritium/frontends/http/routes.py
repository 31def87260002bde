"""The HTTP route table, as data, and the matcher that reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

# (method, path pattern, handler name). In patterns, {model} is one path segment and a
# model path may carry /versions/<n> right after the model name.
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/v2/health/live", "health_live"),
    ("GET", "/v2/health/ready", "health_ready"),
    ("GET", "/v2", "server_metadata"),
    ("POST", "/v2/repository/index", "repository_index"),
    ("POST", "/v2/repository/models/{model}/load", "model_load"),
    ("POST", "/v2/repository/models/{model}/unload", "model_unload"),
    ("GET", "/v2/models/stats", "model_statistics"),
    ("GET", "/v2/models/{model}", "model_metadata"),
    ("GET", "/v2/models/{model}/ready", "model_ready"),
    ("GET", "/v2/models/{model}/config", "model_config"),
    ("GET", "/v2/models/{model}/stats", "model_statistics"),
    ("POST", "/v2/models/{model}/infer", "infer"),
    ("POST", "/v2/models/{model}/generate", "generate"),
    ("POST", "/v2/models/{model}/generate_stream", "generate_stream"),
    ("GET", "/v2/logging", "log_settings"),
    ("POST", "/v2/logging", "log_settings"),
    ("GET", "/v2/trace/setting", "trace_settings"),
    ("POST", "/v2/trace/setting", "trace_settings"),
)


_SEEN_LIMIT = 4096  # distinct (method, path) pairs remembered before starting afresh


@dataclass(frozen=True, slots=True)
class Match:
    handler: str
    model: str | None = None
    version: str | None = None


class NoRoute(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _compile(pattern: str) -> re.Pattern[str]:
    regex = re.escape(pattern).replace(r"\{model\}", r"(?P<model>[^/]+)")
    if pattern.startswith("/v2/models/{model}"):
        versioned = r"(?P<model>[^/]+)(?:/versions/(?P<version>[^/]*))?"
        regex = regex.replace(r"(?P<model>[^/]+)", versioned, 1)
    return re.compile(regex + r"\Z")


class Router:
    def __init__(self, routes: tuple[tuple[str, str, str], ...] = ROUTES):
        self._static: dict[str, dict[str, str]] = {}
        self._dynamic: list[tuple[re.Pattern[str], dict[str, str]]] = []
        self._seen: dict[tuple[str, str], Match | NoRoute] = {}
        by_pattern: dict[str, dict[str, str]] = {}
        for method, pattern, handler in routes:
            by_pattern.setdefault(pattern, {})[method] = handler
        for pattern, methods in by_pattern.items():
            if "{" in pattern:
                self._dynamic.append((_compile(pattern), methods))
            else:
                self._static[pattern] = methods

    def match(self, method: str, path: str) -> Match:
        # Clients hit the same few URLs over and over: remember what each resolved to.
        key = (method, path)
        found = self._seen.get(key)
        if found is None:
            found = self._match(method, path)
            if len(self._seen) >= _SEEN_LIMIT:
                self._seen.clear()
            self._seen[key] = found
        if isinstance(found, NoRoute):
            raise NoRoute(found.status, found.message)  # a fresh one: no traceback build-up
        return found

    def _match(self, method: str, path: str) -> Match | NoRoute:
        try:
            return self._lookup(method, path)
        except NoRoute as exc:
            return exc

    def _lookup(self, method: str, path: str) -> Match:
        methods = self._static.get(path)
        if methods is not None:
            return Match(_pick(methods, method))
        for regex, methods in self._dynamic:
            found = regex.match(path)
            if found is not None:
                return Match(_pick(methods, method), unquote(found["model"]),
                             found.groupdict().get("version"))
        raise NoRoute(404, "Not Found")


def _pick(methods: dict[str, str], method: str) -> str:
    handler = methods.get(method)
    if handler is None:
        raise NoRoute(405, "Method Not Allowed")
    return handler
