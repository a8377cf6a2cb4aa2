"""``modelyard.streaming.StreamingBody``: the streamed upload's body, read by a worker thread from the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from modelyard import streaming
from modelyard.streaming import BodyTooLarge, StreamingBody

KIB = 1024
MESSAGE = 64 * KIB  # about what uvicorn hands over per body message


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


def body_of(loop: asyncio.AbstractEventLoop, data: bytes) -> tuple[StreamingBody, list[int]]:
    """A body over ``data`` in 64 KiB messages; the list counts the messages received."""
    received: list[int] = []

    async def receive() -> dict[str, Any]:
        start = len(received) * MESSAGE
        received.append(start)
        chunk = data[start : start + MESSAGE]
        return {"type": "http.request", "body": chunk, "more_body": start + MESSAGE < len(data)}

    channel = asyncio.run_coroutine_threadsafe(_channel(receive), loop).result()
    return StreamingBody(channel, loop), received


async def _channel(receive: Any) -> Any:
    return streaming._Channel(receive, streaming=True, path="/api/v1/models/m/versions")


@pytest.mark.parametrize("size", [1000, MESSAGE, 1024 * KIB, 3 * 1024 * KIB + 5])
def test_reads_return_the_exact_bytes_in_order_with_one_hand_over_each(loop, monkeypatch, size):
    data = bytes(range(256)) * (20 * 1024 + 3)  # 5 MiB and 768 bytes: 81 messages, the last one short
    body, received = body_of(loop, data)
    hand_overs = []
    real = asyncio.run_coroutine_threadsafe

    def counted(coroutine: Any, target: Any) -> Any:
        hand_overs.append(1)
        return real(coroutine, target)

    monkeypatch.setattr(streaming.asyncio, "run_coroutine_threadsafe", counted)
    got = []
    while chunk := body.read(size):
        got.append(chunk)
    assert b"".join(got) == data
    assert all(len(chunk) == size for chunk in got[:-1]) and 0 < len(got[-1]) <= size
    assert len(received) == -(-len(data) // MESSAGE) and body.received == len(data)
    # A read waits on the event loop once, however many messages it takes (at most one a message).
    assert len(hand_overs) == min(len(got), len(received))


def test_readline_and_a_read_of_the_rest(loop):
    data = b"first line\r\nsecond\n" + b"x" * (3 * MESSAGE)
    body, _ = body_of(loop, data)
    assert body.readline() == b"first line\r\n"
    assert body.readline(3) == b"sec"
    assert body.readline() == b"ond\n"
    assert body.read() == b"x" * (3 * MESSAGE)
    assert body.read(10) == b""


def test_a_line_across_messages_and_reads_that_split_a_message(loop):
    line = b"a" * (MESSAGE + 10) + b"\n"  # its newline in the second message
    data = line + b"b" * (2 * MESSAGE) + b"\n" + b"tail"
    body, _ = body_of(loop, data)
    assert body.readline() == line
    assert body.readline(MESSAGE) == b"b" * MESSAGE  # a line longer than the size asked for: that size
    assert body.read(7) == b"b" * 7
    assert body.readline() == b"b" * (MESSAGE - 7) + b"\n"
    assert body.readline() == b"tail"  # the last line has no newline
    assert body.readline() == b""
    assert body.received == len(data)


def test_a_body_over_the_upload_limit_stops_the_read(loop, settings):
    settings.MAX_UPLOAD_BYTES = 3 * MESSAGE
    body, received = body_of(loop, b"y" * (10 * MESSAGE))
    with pytest.raises(BodyTooLarge, match=f"larger than the limit of {3 * MESSAGE} bytes"):
        body.read(1024 * KIB)
    assert len(received) == 4  # the message that passed the limit was the last one received
    body.read()
    assert len(received) == 4  # and the body is over: nothing more is received


def slow_body(loop: asyncio.AbstractEventLoop, pauses: list[float]) -> StreamingBody:
    """A body of one 64 KiB message after each pause (seconds), then silence if the last pause is None."""

    async def receive() -> dict[str, Any]:
        if not pauses:
            await asyncio.Event().wait()  # the client says nothing more
        await asyncio.sleep(pauses.pop(0))
        return {"type": "http.request", "body": b"z" * MESSAGE, "more_body": True}

    return StreamingBody(asyncio.run_coroutine_threadsafe(_channel(receive), loop).result(), loop)


def test_a_read_waits_as_long_as_messages_keep_coming_within_the_idle_timeout(loop, settings):
    settings.BODY_IDLE_TIMEOUT_SECONDS = 0.5
    body = slow_body(loop, [0.2, 0.2, 0.2, 0.2])  # 0.8 s for one read: longer than the timeout, never silent that long
    assert body.read(4 * MESSAGE) == b"z" * (4 * MESSAGE)


def test_a_client_silent_for_the_idle_timeout_ends_the_read(loop, settings, caplog):
    settings.BODY_IDLE_TIMEOUT_SECONDS = 0.3
    body = slow_body(loop, [0.0, 0.1])  # two messages, then nothing
    with pytest.raises(streaming.BodyIdleTimeout, match=r"no request body bytes arrived for 0.3 s"):
        body.read(4 * MESSAGE)
    assert body.received == 2 * MESSAGE
    assert "/api/v1/models/m/versions: the client sent no body bytes for 0.3 s; request ended" in caplog.text
    assert body.read() == b"z" * (2 * MESSAGE)  # what arrived before the silence; nothing more is received
