"""`loraplex` command line: prepare-model, generate (offline), the server commands, and the tenant commands
(login, adapters, endpoints, batch, usage, keys: platform/client/, a client of the REST API)."""

from __future__ import annotations

import argparse
import sys

import loraplex.envvars.openmp  # noqa: F401  # OpenMP's barrier waits, before a command loads torch


def _cmd_prepare_model(args: argparse.Namespace) -> int:
    from loraplex.engine.model.files import prepare_default_model

    path = prepare_default_model(force=args.force)
    print(path)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    """Offline generation from the bundled (or given) model; one chat prompt per argument."""
    from loraplex.engine import LLM, SamplingParams

    llm = LLM(model=args.model)
    prompts = [llm.chat_prompt([{"role": "user", "content": p}]) for p in args.prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for prompt, out in zip(args.prompts, llm.generate(prompts, params)):
        print(f"### {prompt}\n{out.text}\n[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}]\n")
    return 0


def build_parser(*, server_commands: bool = True) -> argparse.ArgumentParser:
    """Every command; `server_commands=False` leaves out those that import the engine (seconds of torch)."""
    parser = argparse.ArgumentParser(prog="loraplex", description="Multi-tenant LoRA serving.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-model", help="convert the bundled SmolLM2 GGUF to a Hugging Face directory (once)")
    p.add_argument("--force", action="store_true", help="convert again even if the directory exists")
    p.set_defaults(func=_cmd_prepare_model)

    p = sub.add_parser("generate", help="generate offline from the model for one or more chat prompts")
    p.add_argument("prompts", nargs="+")
    p.add_argument("--model", default=None, help="Hugging Face Llama directory (default: bundled SmolLM2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=_cmd_generate)

    if server_commands:
        add_server_commands(sub)
    add_client_commands(sub)
    return parser


def add_server_commands(sub: argparse._SubParsersAction) -> None:
    """`serve`, `db upgrade` and `admin-key` (the platform's commands)."""
    from loraplex.platform.settings import add_database_arguments, add_server_arguments

    p = sub.add_parser("serve", help="run the OpenAI-compatible server (Litestar + uvicorn)")
    add_server_arguments(p)
    p.set_defaults(func=_cmd_serve)

    db = sub.add_parser("db", help="registry database commands").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("upgrade", help="apply the Alembic migrations (server start-up does this too)")
    add_database_arguments(p)
    p.add_argument("--revision", default="head", help="target revision (default: head)")
    p.set_defaults(func=_cmd_db_upgrade)

    p = db.add_parser("downgrade", help="revert the registry schema to a revision ('base' drops every table)")
    add_database_arguments(p)
    p.add_argument("revision")
    p.set_defaults(func=_cmd_db_downgrade)

    p = sub.add_parser("admin-key", help="create another admin key in the registry and print it once")
    add_database_arguments(p)
    p.set_defaults(func=_cmd_admin_key)


def add_client_commands(sub: argparse._SubParsersAction) -> None:
    """The tenant commands (platform/client/): clients of the REST API."""
    from loraplex.platform.client.commands import add_client_commands as add

    add(sub)


def _cmd_serve(args: argparse.Namespace) -> int:
    from loraplex.platform.server import run
    from loraplex.platform.settings import settings_from_args

    run(settings_from_args(args))
    return 0


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    import asyncio

    from loraplex.platform.db.migrate import current_revision, upgrade
    from loraplex.platform.settings import settings_from_args

    settings = settings_from_args(args)
    url = settings.resolved_database_url
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(upgrade(url, settings.database_schema, args.revision))
    print(f"registry at revision {asyncio.run(current_revision(url, settings.database_schema))}")
    return 0


def _cmd_db_downgrade(args: argparse.Namespace) -> int:
    import asyncio

    from loraplex.platform.db.migrate import current_revision, downgrade
    from loraplex.platform.settings import settings_from_args

    settings = settings_from_args(args)
    url = settings.resolved_database_url
    asyncio.run(downgrade(url, args.revision, settings.database_schema))
    print(f"registry at revision {asyncio.run(current_revision(url, settings.database_schema))}")
    return 0


def _cmd_admin_key(args: argparse.Namespace) -> int:
    import asyncio

    from loraplex.platform.db.migrate import upgrade
    from loraplex.platform.db.session import Database
    from loraplex.platform.settings import settings_from_args
    from loraplex.platform.storage.cache import RegistryCache
    from loraplex.platform.tenants.service import TenantService

    settings = settings_from_args(args)

    async def create() -> str:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        await upgrade(settings.resolved_database_url, settings.database_schema)
        db = Database(settings.resolved_database_url, settings.database_schema)
        try:
            return await TenantService(db, RegistryCache()).create_admin_key()
        finally:
            await db.close()

    print(asyncio.run(create()))
    return 0


def main(argv: list[str] | None = None) -> None:
    from loraplex.envvars.safe_path import refuse_checkout_on_path

    refuse_checkout_on_path("the `loraplex` command, or `python -P -m loraplex.platform.cli`")
    from loraplex.platform.client.commands import COMMANDS

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(server_commands=not argv or argv[0] not in COMMANDS).parse_args(argv)
    try:
        code = args.func(args)
    except ValueError as exc:  # ModelLoadError, RequestError, ...: a clear message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
