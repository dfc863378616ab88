"""Stand-in for slime.utils.http_utils: init_http_client() and post() over one shared httpx client.

As in slime, post() has no client until init_http_client(args) ran (the rollout manager calls it; a
standalone script must), uses no timeout, and retries ANY error (4xx too) 60 times, 1 s apart.
"""

import asyncio
import json
import logging

import httpx

logger = logging.getLogger(__name__)

_http_client: httpx.AsyncClient | None = None


def get_rollout_num_engines(args) -> int:
    if (num_engines := getattr(args, "rollout_num_engines", None)) is not None:
        return int(num_engines)
    rollout_num_gpus = getattr(args, "rollout_num_gpus", None) or 0
    per_engine = getattr(args, "rollout_num_gpus_per_engine", None) or 1
    return 0 if rollout_num_gpus <= 0 else max(1, rollout_num_gpus // per_engine)


def init_http_client(args):
    global _http_client
    num_engines = get_rollout_num_engines(args)
    if num_engines <= 0:
        return
    if _http_client is None:
        _http_client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=args.sglang_server_concurrency * num_engines),
            timeout=httpx.Timeout(None),
            trust_env=False,
        )


async def post(url, payload, max_retries=60, headers=None):
    retry_count = 0
    while retry_count < max_retries:
        try:
            response = await _http_client.post(url, json=payload or {}, headers=headers)
            response.raise_for_status()
            content = await response.aread()
            try:
                return json.loads(content)
            except json.JSONDecodeError:
                return content.decode()
        except Exception as e:
            retry_count += 1
            logger.info(f"Error: {e}, retrying... (attempt {retry_count}/{max_retries}, url={url})")
            if retry_count >= max_retries:
                raise
            await asyncio.sleep(1)


async def get(url):
    response = await _http_client.get(url)
    response.raise_for_status()
    content = await response.aread()
    return json.loads(content)


def reset_http_client() -> None:
    """Test helper (not in slime): forget the client, whose connections belong to a finished event loop."""
    global _http_client
    _http_client = None
