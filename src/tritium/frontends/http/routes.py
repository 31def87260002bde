"""The HTTP route matcher: method and path to the handler a route table points at."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import unquote

H = TypeVar("H")  # what a route points at: the handler the caller will call

_SEEN_LIMIT = 4096  # distinct (method, path) pairs remembered before starting afresh


@dataclass(frozen=True, slots=True)
class Match:
    """What the path named besides the handler."""

    model: str | None = None
    version: str | None = None


_NOTHING = Match()


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


class Router(Generic[H]):
    """Routes are (method, path pattern, handler). In patterns, {model} is one path segment,
    and a model path may carry /versions/<n> right after the model name."""

    def __init__(self, routes: Iterable[tuple[str, str, H]]):
        self._static: dict[str, dict[str, H]] = {}
        self._dynamic: list[tuple[re.Pattern[str], dict[str, H]]] = []
        self._seen: dict[tuple[str, str], tuple[H, Match] | NoRoute] = {}
        by_pattern: dict[str, dict[str, H]] = {}
        for method, pattern, handler in routes:
            by_pattern.setdefault(pattern, {})[method] = handler
        for pattern, methods in by_pattern.items():
            if "{" in pattern:
                self._dynamic.append((_compile(pattern), methods))
            else:
                self._static[pattern] = methods

    def match(self, method: str, path: str) -> tuple[H, Match]:
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

    def _match(self, method: str, path: str) -> tuple[H, Match] | NoRoute:
        try:
            return self._lookup(method, path)
        except NoRoute as exc:
            return exc

    def _lookup(self, method: str, path: str) -> tuple[H, Match]:
        methods = self._static.get(path)
        if methods is not None:
            return _pick(methods, method), _NOTHING
        for regex, methods in self._dynamic:
            found = regex.match(path)
            if found is not None:
                return _pick(methods, method), Match(unquote(found["model"]),
                                                     found.groupdict().get("version"))
        raise NoRoute(404, "Not Found")


def _pick(methods: dict[str, H], method: str) -> H:
    handler = methods.get(method)
    if handler is None:
        raise NoRoute(405, "Method Not Allowed")
    return handler
