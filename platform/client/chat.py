"""`loraplex chat MODEL MESSAGE [--schema S]`: one chat completion, optionally held to a JSON schema
(`response_format: json_schema`), printing the answer; how the schema was enforced (the `x-loraplex-schema`
headers) goes to stderr. The shortest way from a fresh server to a constrained answer without curl."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from loraplex.platform.client.http import Connection, UsageError, client_command
from loraplex.platform.client.output import print_json

SCHEMA_HEADER, NARROWING_HEADER = "x-loraplex-schema", "x-loraplex-schema-narrowing"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "chat", parents=[common], help="send one chat message to a model or endpoint; --schema holds it to JSON"
    )
    p.add_argument("model", help="the base model, an adapter's model id, or an endpoint")
    p.add_argument("message", help="the user message")
    p.add_argument("--schema", help="a JSON schema: a file, or the schema itself as JSON text")
    p.add_argument("--max-tokens", type=int, default=256, help="the most tokens to generate (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--field-logprobs", action="store_true", help="also print each field's logprobs (with --schema)")
    p.set_defaults(func=client_command(chat))


def load_schema(text: str) -> dict[str, Any]:
    """The schema as JSON text (it starts with "{") or from a file's path; a usage error names what failed."""
    if text.lstrip().startswith("{"):
        source, raw = "--schema", text
    else:
        source = f"schema file {text!r}"
        try:
            raw = Path(text).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror}") from None
    try:
        schema = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{source} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise UsageError(f"{source} is not a JSON object")
    return schema


def chat(args: argparse.Namespace, conn: Connection) -> int:
    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be at least 1")
    body: dict[str, Any] = {
        "model": args.model,
        "messages": [{"role": "user", "content": args.message}],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
    }
    if args.schema is not None:
        schema = load_schema(args.schema)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        if args.field_logprobs:
            body["field_logprobs"] = True
    elif args.field_logprobs:
        raise UsageError("--field-logprobs needs --schema")
    r = conn.api.request("POST", "/v1/chat/completions", json=body)
    out = r.json()
    if args.json:
        print_json(out)
    else:
        choice = out["choices"][0]
        print(choice["message"]["content"])
        if choice.get("field_logprobs"):
            print_json(choice["field_logprobs"])
    if SCHEMA_HEADER in r.headers:
        narrowing = r.headers.get(NARROWING_HEADER)
        print(f"schema: {r.headers[SCHEMA_HEADER]}" + (f" ({narrowing})" if narrowing else ""), file=sys.stderr)
    return 0
