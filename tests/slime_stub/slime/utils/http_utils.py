"""Stand-in for slime.utils.http_utils.post: shared client, no timeout, retry any error 60 times, 1 s apart."""

import asyncio
import json
import logging

import httpx

logger = logging.getLogger(__name__)

_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


def _client() -> httpx.AsyncClient:
    # slime keeps one global client; the tests run several event loops, so keep one per loop.
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = _clients[loop] = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None), timeout=httpx.Timeout(None)
        )
    return client


async def post(url, payload, max_retries=60, headers=None):
    retry_count = 0
    while True:
        try:
            response = await _client().post(url, json=payload or {}, headers=headers)
            response.raise_for_status()
            try:
                return response.json()
            except json.JSONDecodeError:
                return response.text
        except Exception as e:
            retry_count += 1
            logger.info(f"Error: {e}, retrying... (attempt {retry_count}/{max_retries}, url={url})")
            if retry_count >= max_retries:
                raise
            await asyncio.sleep(1)
