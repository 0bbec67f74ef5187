"""Downloading a shared file's bytes over HTTP, every failure a FetchError in words
(adapters/shared_files.py): the platforms' `FileEnd.fetch` call it with their own refusals,
checks, and which redirects they follow."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
from yarl import URL

from adapters.shared_files import FetchError, oversized

REDIRECTS = {301, 302, 303, 307, 308}
MAX_REDIRECTS = 5


async def download(
    url: str, name: str, platform: str, max_bytes: int, timeout_seconds: float,
    headers: dict[str, str] | None = None, refused: Mapping[int, str] | None = None,
    check=None, follow: Callable[[URL], None] | None = None,
) -> bytes:  # fmt: skip
    """GET `url` up to `max_bytes`; every failure a FetchError in words. `refused`: the words
    for statuses that will not change; `check(response)`: the platform's own refusal;
    `follow(target)`: asked before each redirect is followed (a FetchError refuses it)."""
    timeout = aiohttp.ClientTimeout(total=timeout_seconds)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            _opened(session, url, name, headers or {}, follow) as response,
        ):
            if response.status in (refused or {}):
                raise FetchError(refused[response.status])
            if response.status >= 400:
                raise FetchError(
                    f"I could not download {name}: {platform} answered {response.status}.",
                    retryable=response.status >= 500 or response.status == 429,
                )
            if check is not None:
                check(response)
            data = bytearray()
            async for piece in response.content.iter_chunked(1 << 16):
                data += piece
                if len(data) > max_bytes:
                    raise FetchError(oversized(name, None, max_bytes))
    except TimeoutError:
        raise FetchError(
            f"I could not download {name}: {platform} took too long.", retryable=True
        ) from None
    except aiohttp.ClientError as exc:
        raise FetchError(
            f"I could not download {name} from {platform} ({exc}).", retryable=True
        ) from None
    return bytes(data)


@contextlib.asynccontextmanager
async def _opened(
    session: aiohttp.ClientSession, url: str, name: str, headers: dict[str, str],
    follow: Callable[[URL], None] | None,
) -> AsyncIterator[aiohttp.ClientResponse]:  # fmt: skip
    """The response to GET `url`. With `follow`, redirects are followed here, each target
    asked of `follow` before any request reaches it (aiohttp would follow them anywhere);
    `headers` go to the first origin only, as aiohttp does."""
    if follow is None:
        async with session.get(url, headers=headers) as response:
            yield response
        return
    target = URL(url)
    for _ in range(MAX_REDIRECTS + 1):
        response = await session.get(target, headers=headers, allow_redirects=False)
        location = response.headers.get("Location")
        if response.status not in REDIRECTS or not location:
            break
        response.release()
        try:
            next_target = response.url.join(URL(location))
        except ValueError:
            raise FetchError(f"I could not download {name}: it redirected nowhere.") from None
        follow(next_target)
        if next_target.origin() != target.origin():
            headers = {}
        target = next_target
    else:
        raise FetchError(f"I could not download {name}: it redirected too many times.")
    try:
        yield response
    finally:
        response.release()
