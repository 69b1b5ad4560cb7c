"""Model access: the one place that turns ModelSettings into a chat call, with a reply cache on disk.

Any OpenAI-compatible endpoint works (OpenAI, vLLM, llama.cpp's server, Ollama) through LangChain's
OpenAI integration. `chat` returns a ChatReply or raises:
- `EndpointUnavailable` for what may pass (429, 5xx, timeouts, refused connections): the Prefect task
  around the agent retries those with backoff;
- `EndpointError` for what will not (bad key, unknown model, a rejected request).
Replies are cached by the hash of (model, messages, sampling parameters), so rerunning a failed flow
run costs no tokens for calls already answered. The endpoint URL is not part of the key: the same
model served elsewhere answers from the same cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from kforge.config import ModelSettings

NO_KEY_PLACEHOLDER = "none"  # local servers (vLLM, llama.cpp, Ollama) accept any key


class ModelCallError(Exception):
    """A model call that produced no reply; the message names the endpoint."""


class EndpointUnavailable(ModelCallError):
    """Rate limits, server errors, timeouts, refused connections: worth retrying."""


class EndpointError(ModelCallError):
    """Bad key, unknown model, rejected request: retrying will not help."""


@dataclass(frozen=True)
class ChatReply:
    text: str
    finish_reason: str | None
    tokens_in: int
    tokens_out: int
    cached: bool = False


def endpoint_name(settings: ModelSettings) -> str:
    return settings.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"


def cost_usd(settings: ModelSettings, tokens_in: int, tokens_out: int) -> float:
    return (
        tokens_in * settings.usd_per_million_input_tokens + tokens_out * settings.usd_per_million_output_tokens
    ) / 1e6


def reply_key(settings: ModelSettings, messages: list[dict[str, str]]) -> str:
    payload = {
        "model": settings.model,
        "messages": messages,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _read_cached(path: Path) -> ChatReply | None:
    try:
        stored = json.loads(path.read_text())
        return ChatReply(
            stored["text"], stored["finish_reason"], stored["tokens_in"], stored["tokens_out"], cached=True
        )
    except (OSError, ValueError, KeyError):
        return None  # absent or damaged: ask the model again


def _write_cached(path: Path, reply: ChatReply) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump({k: v for k, v in asdict(reply).items() if k != "cached"}, handle)
    os.replace(partial, path)


def chat_model(settings: ModelSettings):
    """A LangChain ChatOpenAI for `settings`; its own retries are off (Prefect task retries do that)."""
    from langchain_openai import ChatOpenAI

    api_key = os.environ.get(settings.api_key_env)
    if not api_key:
        if not settings.base_url:
            raise EndpointError(
                f"no API key: set {settings.api_key_env} (or name another variable with --api-key-env), "
                "or give --base-url for a local endpoint"
            )
        api_key = NO_KEY_PLACEHOLDER
    return ChatOpenAI(
        model=settings.model,
        base_url=settings.base_url,
        api_key=api_key,
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        timeout=settings.timeout_s,
        max_retries=0,
    )


def _call_model(settings: ModelSettings, messages: list[dict[str, str]]) -> ChatReply:
    import openai

    url = endpoint_name(settings)
    try:
        message = chat_model(settings).invoke([(m["role"], m["content"]) for m in messages])
    except openai.APITimeoutError as exc:
        raise EndpointUnavailable(f"model endpoint {url} did not answer within {settings.timeout_s:g} s") from exc
    except openai.APIConnectionError as exc:
        raise EndpointUnavailable(f"model endpoint {url} unreachable: {exc}") from exc
    except (openai.RateLimitError, openai.InternalServerError) as exc:
        raise EndpointUnavailable(f"model endpoint {url} answered HTTP {exc.status_code}: {exc.message}") from exc
    except openai.APIStatusError as exc:
        raise EndpointError(f"model endpoint {url} refused the request, HTTP {exc.status_code}: {exc.message}") from exc
    usage = message.usage_metadata or {}
    text = message.content if isinstance(message.content, str) else json.dumps(message.content)
    return ChatReply(
        text=text,
        finish_reason=message.response_metadata.get("finish_reason"),
        tokens_in=int(usage.get("input_tokens", 0)),
        tokens_out=int(usage.get("output_tokens", 0)),
    )


def chat(settings: ModelSettings, messages: list[dict[str, str]], cache_dir: str | Path | None) -> ChatReply:
    """The model's reply to `messages` ({"role", "content"} dicts), from the cache when allowed and present."""
    if not settings.model:
        raise EndpointError("no model configured (--model NAME)")
    cache_path = Path(cache_dir) / "replies" / f"{reply_key(settings, messages)}.json" if cache_dir else None
    if cache_path and settings.reply_cache and (cached := _read_cached(cache_path)):
        return cached
    reply = _call_model(settings, messages)
    if cache_path:
        try:
            _write_cached(cache_path, reply)
        except OSError:
            pass  # a full cache disk costs tokens on a rerun, never the reply in hand
    return reply


def check_endpoint(settings: ModelSettings, timeout_s: float = 10.0) -> None:
    """Fail fast, before a run starts, when the endpoint cannot be reached or refuses the key.
    Raises EndpointUnavailable or EndpointError; an endpoint without a /models route passes."""
    import openai

    url = endpoint_name(settings)
    api_key = os.environ.get(settings.api_key_env) or (NO_KEY_PLACEHOLDER if settings.base_url else None)
    if not api_key:
        chat_model(settings)  # raises the one-line 'no API key' error
    client = openai.OpenAI(base_url=url, api_key=api_key, timeout=timeout_s, max_retries=0)
    try:
        client.models.list()
    except openai.APIConnectionError as exc:
        raise EndpointUnavailable(f"model endpoint {url} unreachable ({type(exc).__name__}: {exc})") from exc
    except openai.AuthenticationError as exc:
        raise EndpointError(f"model endpoint {url} refused the key in {settings.api_key_env}: {exc.message}") from exc
    except openai.APIStatusError:
        pass  # some servers have no /models; the first real call will tell
