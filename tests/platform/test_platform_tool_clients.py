"""Tool calling on the real SmolLM2 behind a started server, through the clients people use: the official
`openai` client (parse with pydantic, pydantic function tools, streamed tool calls), instructor (TOOLS and
JSON_SCHEMA modes), LangChain's `with_structured_output` (json_schema and function_calling) and the OpenAI
Agents SDK. Every parsed object is validated by pydantic (the clients do it; a failure raises)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest

from loraplex.platform.app import create_app
from tests.platform.conftest import settings_for
from tests.platform.helpers import ServerThread, create_tenant

pytestmark = pytest.mark.slow


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    unit: Literal["celsius", "fahrenheit"]


class Address(pydantic.BaseModel):
    street: str = pydantic.Field(max_length=40)
    zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=120)
    home: Address


SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": Weather.model_json_schema(),
    "book_table": {
        "type": "object",
        "properties": {
            "guests": {"type": "integer", "minimum": 1, "maximum": 8},
            "date": {"type": "string", "format": "date"},
            "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
        },
        "required": ["guests", "date", "time"],
    },
    "send_email": {
        "type": "object",
        "properties": {
            "to": {"type": "string", "format": "email"},
            "subject": {"type": "string", "maxLength": 40},
            "urgent": {"type": "boolean"},
        },
        "required": ["to", "subject"],
    },
    "convert_currency": {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
            "from": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
            "to": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
        },
        "required": ["amount", "from", "to"],
    },
    "save_person": Person.model_json_schema(),  # nested model under $defs
}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in SCHEMAS.items()]
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Hanoi", "Dakar", "Riga"]
ASKS = [
    "What's the weather in {c}?",
    "Book a table for {n} people in {c} on 2025-03-0{d} at 19:30.",
    "Email bob@example.com that I land in {c} soon.",
    "How much is {n}00 EUR in USD? I am flying to {c}.",
    "Save Ana, {n}{d} years old, living at 3 Main St, {c}, zip 7500{d}.",
]


@pytest.fixture(scope="module")
def smol(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from loraplex.engine import AsyncEngine, EngineArgs

    engine = AsyncEngine(EngineArgs(max_model_len=1024, kv_cache_bytes=256 * 1024 * 1024, max_num_seqs=32))
    settings = settings_for("sqlite", tmp_path_factory.mktemp("tools-data"))
    server = ServerThread(create_app(settings, engine=engine)).start()
    key = create_tenant(server.url, "tool-clients")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=600)
    yield server, key, client, engine.model_name
    server.stop()
    engine.shutdown()


def _check(call: Any) -> None:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name], format_checker=jsonschema.FormatChecker())


def _shortest(client: openai.OpenAI, model: str, choice: Any, parallel: bool) -> int:
    """The tokens the shortest output the server knows takes (its 400 for a budget below that says so)."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                       tool_choice=choice, parallel_tool_calls=parallel, max_tokens=2)  # fmt: skip
    return int(e.value.body["message"].split("needs ")[1].split()[0])


def test_fifty_prompts_every_call_validates_also_under_tight_budgets(smol) -> None:
    _, _, client, model = smol
    names = list(SCHEMAS)
    named = [{"type": "function", "function": {"name": n}} for n in names]
    shortest = {(n, p): _shortest(client, model, c, p) for n, c in zip(names, named) for p in (False, True)}
    shortest |= {("required", p): _shortest(client, model, "required", p) for p in (False, True)}
    assert min(shortest.values()) > 5

    def run(i: int) -> tuple[Any, int, str | None]:
        prompt = ASKS[i % 5].format(c=CITIES[i // 5], n=2 + i % 5, d=1 + i % 9)
        choice: Any = named[i % 5] if i % 2 == 0 else "required"
        key = names[i % 5] if i % 2 == 0 else "required"
        parallel = i % 3 == 0
        budget = shortest[key, parallel] + (i % 3) if i % 4 == 0 else 100  # every 4th: at most 2 above the least
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=parallel,
            temperature=0.7,
            seed=i,
            max_tokens=budget,
        )
        return out, budget, names[i % 5] if i % 2 == 0 else None

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, range(50)))
    tight = 0
    for out, budget, name in results:
        ch = out.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
        for call in ch.message.tool_calls:
            _check(call)
            assert name is None or call.function.name == name
        assert out.usage.completion_tokens <= budget
        tight += budget < 100
    assert tight == 13


def test_openai_parse_pydantic_tools_and_streaming(smol) -> None:
    _, _, client, model = smol
    person = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Ana is 31 and lives at 3 Main St, zip 75001. Give her as JSON."}],
        response_format=Person,
        temperature=0,
        max_tokens=80,
    )
    assert isinstance(person.choices[0].message.parsed, Person)

    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    out = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "What's the weather in Oslo?"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=40,
    )
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls" and isinstance(call.function.parsed_arguments, Weather)

    with client.chat.completions.stream(
        model=model,
        messages=[{"role": "user", "content": "What's the weather in Lima?"}],
        tools=[tool],
        tool_choice="required",
        temperature=0,
        max_tokens=40,
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in events and "tool_calls.function.arguments.done" in events
    streamed = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls" and isinstance(streamed.function.parsed_arguments, Weather)


def test_instructor_tools_and_json_schema(smol) -> None:
    import instructor

    server, key, _, model = smol
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=f"{server.url}/v1", api_key=key), mode=mode)
        person = client.chat.completions.create(
            model=model,
            response_model=Person,
            messages=[{"role": "user", "content": "Tom, 44, lives at 9 Elm Rd, zip 10115."}],
            max_retries=0,
            temperature=0,
            max_tokens=80,
        )
        assert isinstance(person, Person)


def test_langchain_structured_output(smol) -> None:
    from langchain_openai import ChatOpenAI

    server, key, _, model = smol
    llm = ChatOpenAI(model=model, base_url=f"{server.url}/v1", api_key=key, temperature=0, max_tokens=60, max_retries=0)
    for method in ("json_schema", "function_calling"):
        weather = llm.with_structured_output(Weather, method=method).invoke("What's the weather in Cairo, in celsius?")
        assert isinstance(weather, Weather), method


def test_openai_agents_sdk_runs_a_function_tool(smol) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    server, key, _, model = smol
    set_tracing_disabled(True)
    asked: list[Weather] = []

    @function_tool
    def get_weather(query: Weather) -> str:
        """The current weather in a city."""
        asked.append(query)
        return f"21 degrees {query.unit} and sunny in {query.city}"

    agent = Agent(
        name="weather",
        instructions="Look up the weather with the tool, then report it in one sentence.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(
            model=model, openai_client=openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        ),
        # the first turn must call; the SDK then resets tool_choice, and the second turn (the call and its
        # result in the history, as tool_calls and a tool message) answers in text
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=40),
    )
    result = Runner.run_sync(agent, "What's the weather in Riga?", max_turns=3)
    assert len(asked) == 1 and isinstance(asked[0], Weather)  # the SDK validated the call's arguments
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert isinstance(result.final_output, str) and result.final_output
