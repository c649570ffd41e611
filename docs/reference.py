"""The reference pages, from the code itself: the API reference from the server's own OpenAPI document
(`app.openapi_schema`: one section per route and method under its tag, then every schema the routes name), the
CLI reference from the `loraplex` argparse parser (one section per command: its help, its usage, its arguments per
group) and the table of the Prometheus metrics `/metrics` exports. Every route, schema and command has a fixed
anchor (`route_anchor`, `schema_anchor`, `command_anchor`) that tests/test_docs.py looks for in the built site.
argparse's own formatter writes each usage and argument (its `_format_action_invocation` and `_expand_help` are
private, but they are what `--help` prints)."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterator
from typing import Any

Json = dict[str, Any]
METHODS = ("get", "post", "put", "patch", "delete")


def operations(doc: Json) -> list[tuple[str, str, Json]]:
    """(method, path, operation) for every route of the document, in its order."""
    return [(m, path, op) for path, item in doc["paths"].items() for m, op in item.items() if m in METHODS]


def route_anchor(method: str, path: str) -> str:
    """`post-v1-endpoints-name-promote` for POST /v1/endpoints/{name}/promote."""
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def schema_anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def text(value: object) -> str:
    """Free text from the code as markdown: `<` outside code spans escaped (`<metrics_token>` is no HTML tag)."""
    parts = str(value).split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _cell(value: object) -> str:
    """One table cell: on one line, pipes escaped."""
    return " ".join(text(value).split()).replace("|", "\\|")


def type_of(schema: Json) -> str:
    """A schema's type in a few words, other schemas as links."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{schema_anchor(name)})"
    for key, joiner in (("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")):
        if key in schema:
            return joiner.join(type_of(part) for part in schema[key])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(type_of({**schema, "type": one}) for one in kind)
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    if kind is None:
        return "any"
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def _notes(schema: Json) -> str:
    """Description, default and bounds of a field or parameter."""
    notes = [schema["description"]] if schema.get("description") else []
    for key, label in (("default", "default"), ("minimum", "min"), ("maximum", "max"), ("minLength", "min length")):
        if key in schema:
            notes.append(f"{label} `{json.dumps(schema[key])}`")
    for key, label in (("maxLength", "max length"), ("pattern", "pattern"), ("minItems", "min items")):
        if key in schema:
            notes.append(f"{label} `{json.dumps(schema[key])}`")
    return "; ".join(notes)


def fields_table(schema: Json) -> list[str]:
    """An object schema's properties: field, type, required, notes."""
    required = set(schema.get("required", []))
    rows = ["| field | type | required | notes |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        needed = "yes" if name in required else ""
        rows.append(f"| `{name}` | {_cell(type_of(prop))} | {needed} | {_cell(_notes(prop))} |")
    return rows


def _body(schema: Json) -> list[str]:
    """A request or response body: a link to its schema, or its fields when it is inline."""
    if "properties" in schema and "$ref" not in schema:
        return ["", *fields_table(schema)]
    return [type_of(schema)]


def route_section(method: str, path: str, op: Json) -> list[str]:
    lines = [f"### `{method.upper()} {path}` {{#{route_anchor(method, path)}}}", ""]
    lines += [text(op.get("summary") or ""), ""]
    if op.get("description"):
        lines += [text(op["description"]), ""]
    lines += ["Auth: " + ("`Authorization: Bearer <key>`." if op.get("security") else "none."), ""]
    if op.get("parameters"):
        lines += ["| parameter | in | type | required | notes |", "|---|---|---|---|---|"]
        for p in op["parameters"]:
            schema = p.get("schema", {})
            notes = _notes({**schema, "description": p.get("description") or schema.get("description")})
            required = "yes" if p.get("required") else ""
            lines.append(f"| `{p['name']}` | {p['in']} | {_cell(type_of(schema))} | {required} | {_cell(notes)} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        if body.get("description"):
            lines += [f"Request body: {text(body['description'])}", ""]
        for media, content in body.get("content", {}).items():
            lines += [f"Request body (`{media}`): " + "\n".join(_body(content.get("schema", {}))), ""]
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"`{media}` {type_of(c['schema'])}" if "schema" in c else f"`{media}`"
            for media, c in response.get("content", {}).items()
        ]
        lines.append(f"| {status} | {_cell(response.get('description', ''))} | {_cell(', '.join(bodies))} |")
    return [*lines, ""]


def api_reference(doc: Json) -> str:
    """The whole generated part of the API page: an index of routes, the routes by tag, the schemas."""
    ops = operations(doc)
    lines = ["## Routes", "", "| route | what it does |", "|---|---|"]
    for method, path, op in ops:
        link = f"[`{method.upper()} {path}`](#{route_anchor(method, path)})"
        lines.append(f"| {link} | {_cell(op.get('summary', ''))} |")
    lines.append("")
    tags: dict[str, list[tuple[str, str, Json]]] = {}
    for method, path, op in ops:
        tags.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    for tag, tagged in tags.items():
        lines += [f"## {tag.capitalize()} {{#tag-{tag}}}", ""]
        for method, path, op in tagged:
            lines += route_section(method, path, op)
    lines += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        lines += [f"### {name} {{#{schema_anchor(name)}}}", ""]
        if schema.get("description"):
            lines += [text(schema["description"]), ""]
        lines += [*(fields_table(schema) if "properties" in schema else [f"Type: {type_of(schema)}"]), ""]
    return "\n".join(lines)


USAGE_COLUMNS = "100"  # usage lines wrap at a fixed width, whatever terminal builds the site


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("loraplex",), help: str | None = None
) -> Iterator[tuple[tuple[str, ...], str | None, argparse.ArgumentParser]]:
    """(command words, one-line help, parser) for the parser and every subcommand under it, depth first."""
    yield path, help or parser.description, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias names the same parser again
                    seen.add(id(sub))
                    yield from commands(sub, (*path, name), helps.get(name))


def command_anchor(path: tuple[str, ...]) -> str:
    """`loraplex-adapters-push` for `loraplex adapters push`."""
    return re.sub(r"[^a-z0-9]+", "-", " ".join(path).lower()).strip("-")


def command_section(path: tuple[str, ...], help: str | None, parser: argparse.ArgumentParser) -> list[str]:
    level = "#" * min(len(path) + 1, 4)
    lines = [f"{level} `{' '.join(path)}` {{#{command_anchor(path)}}}", ""]
    if help:
        lines += [text(help), ""]
    formatter = parser._get_formatter()
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        ]
        if not actions:
            continue
        lines += [f"| {_cell(group.title)} | |", "|---|---|"]
        for action in actions:
            invocation = formatter._format_action_invocation(action)
            explained = _cell(formatter._expand_help(action)) if action.help else ""
            lines.append(f"| `{' '.join(invocation.split())}` | {explained} |")
        lines.append("")
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subcommands:
        names = list({id(sub): name for name, sub in reversed(action.choices.items())}.values())[::-1]
        links = [f"[`{name}`](#{command_anchor((*path, name))})" for name in names]
        lines += ["Subcommands: " + ", ".join(links) + ".", ""]
    return lines


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """Every command of `parser`, in the order `--help` lists them."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = USAGE_COLUMNS
    try:
        return "\n".join(line for entry in commands(parser) for line in command_section(*entry))
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def exposed_name(name: str, kind: str) -> str:
    """The name a scrape shows: a counter's family name plus `_total` (prometheus_client keeps it without)."""
    return f"{name}_total" if kind == "counter" else name


def metrics_reference(metrics: Any) -> str:
    """Every metric of a `loraplex.platform.metrics.Metrics` registry (tenant labels on), as `/metrics` shows it:
    name, type, labels, meaning. Labels come from the declared label names, or from the samples of the metrics
    the engine collector makes at scrape time."""
    from prometheus_client.metrics import MetricWrapperBase

    declared = {w._name: w._labelnames for w in vars(metrics).values() if isinstance(w, MetricWrapperBase)}
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for metric in metrics.registry.collect():
        labels = declared.get(metric.name) or sorted({k for s in metric.samples for k in s.labels if k != "le"})
        label_text = ", ".join(f"`{label}`" for label in labels)
        name = exposed_name(metric.name, metric.type)
        rows.append(f"| `{name}` | {metric.type} | {label_text} | {_cell(metric.documentation)} |")
    return "\n".join(rows)


def variables_reference(variables: Any) -> str:
    """loraplex's own variables (`loraplex.envvars.VARIABLES`): name and meaning."""
    rows = ["| variable | meaning |", "|---|---|"]
    rows += [f"| `{v.name}` | {_cell(v.meaning)} |" for v in variables]
    return "\n".join(rows)


def settings_reference(names: list[str], serve: argparse.ArgumentParser) -> str:
    """The `LORAPLEX_<NAME>` variable of every server setting and engine argument (`names`), beside the `serve`
    flag that sets the same value (engine arguments' flags have the dest `engine__<name>`) and its help."""
    formatter = serve._get_formatter()
    by_dest = {action.dest: action for action in serve._actions}
    rows = ["| variable | flag | meaning |", "|---|---|---|"]
    for name in names:
        action = by_dest.get(name) or by_dest.get(f"engine__{name}")
        flag = f"`{action.option_strings[-1]}`" if action and action.option_strings else "(none)"
        meaning = _cell(formatter._expand_help(action)) if action and action.help else ""
        rows.append(f"| `LORAPLEX_{name.upper()}` | {flag} | {meaning} |")
    return "\n".join(rows)
