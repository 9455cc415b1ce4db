"""Who may silence the server's log through POST /v2/logging: with a token set, only a request
that carries it (401 otherwise, nothing changed); on a server without a token nobody can turn
warning or error logging off (403, nothing changed), while making the log more or less verbose
above that stays open, as Triton's clients use it. Oracle: the level of the "segfuse" logger."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def segfuse_logger():
    logger = logging.getLogger("segfuse")
    before = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(before)


@pytest.mark.parametrize("body", [{"log_error": False}, {"log_warning": False},
                                  {"log_verbose_level": 0, "log_info": False, "log_warning": False}])
async def test_without_a_token_warning_and_error_logging_cannot_be_turned_off(asgi_server, segfuse_logger, body):
    async with asgi_server() as c:
        r = await c.post("/v2/logging", json=body)
        assert r.status_code == 403, r.text
        assert "--token" in r.json()["error"] and r.json()["details"][0]["loc"][0] == "body"
        assert segfuse_logger.getEffectiveLevel() == logging.INFO
        assert (await c.get("/v2/logging")).json()["log_error"] is True


async def test_without_a_token_the_verbosity_above_warnings_still_changes(asgi_server, segfuse_logger):
    async with asgi_server() as c:
        r = await c.post("/v2/logging", json={"log_verbose_level": 1})
        assert r.status_code == 200 and segfuse_logger.getEffectiveLevel() == logging.DEBUG
        r = await c.post("/v2/logging", json={"log_verbose_level": 0, "log_info": False})
        assert r.status_code == 200 and segfuse_logger.getEffectiveLevel() == logging.WARNING
        r = await c.post("/v2/logging", json={"log_error": True})  # keeping errors on is no change
        assert r.status_code == 200 and segfuse_logger.getEffectiveLevel() == logging.WARNING


async def test_with_a_token_only_its_holder_turns_error_logging_off(asgi_server, segfuse_logger):
    async with asgi_server(token="s3cret") as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = await c.post("/v2/logging", json={"log_error": False}, headers=headers)
            assert r.status_code == 401, r.text
            assert segfuse_logger.getEffectiveLevel() == logging.INFO
        r = await c.post("/v2/logging", json={"log_error": False}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200, r.text
        assert r.json()["log_error"] is False and segfuse_logger.getEffectiveLevel() > logging.ERROR


async def test_without_a_token_a_server_started_quieter_keeps_its_level(asgi_server, segfuse_logger):
    """--log-level error: a request that keeps that level is no silencing; going further is."""
    segfuse_logger.setLevel(logging.ERROR)
    async with asgi_server() as c:
        r = await c.post("/v2/logging", json={"log_verbose_level": 0})
        assert r.status_code == 200 and segfuse_logger.getEffectiveLevel() == logging.ERROR
        assert (await c.post("/v2/logging", json={"log_error": False})).status_code == 403
        assert segfuse_logger.getEffectiveLevel() == logging.ERROR
