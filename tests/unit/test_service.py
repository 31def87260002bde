"""InferenceService.submit: what it refuses before a request reaches any model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tritium.core.cancellation import Cancellation
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest
from tritium.core.service import InferenceService


class NoModels:
    """A repository that must not be asked: refusals come before any lookup."""

    def resolve(self, name: str, version: int | None) -> Any:
        raise AssertionError("submit looked a model up")


def test_cancellation_made_for_another_loop_is_refused() -> None:
    other = asyncio.new_event_loop()
    try:
        async def main() -> None:
            service = InferenceService(NoModels(), asyncio.get_running_loop())  # type: ignore[arg-type]
            request = InferenceRequest(model_name="m", inputs={})
            with pytest.raises(TritiumError) as caught:
                service.submit(request, Cancellation(other))
            assert caught.value.code is ErrorCode.INTERNAL
            assert "loop" in caught.value.message
            assert service.in_flight() == []

        asyncio.run(main())
    finally:
        other.close()
