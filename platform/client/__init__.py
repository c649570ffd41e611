"""`loraplex` tenant commands (`login`, `adapters`, `endpoints`, `batch`, `usage`, `keys`): a client of the
REST API only, with no route or server code of its own.

Built on argparse, tqdm and httpx: `loraplex` is an argparse program already (platform/cli.py,
platform/settings.py) and tqdm and httpx are direct dependencies of the package; click, typer and rich are in
`.venv` only as other packages' dependencies, so using them would add dependencies to the locks.

One module per resource group (login, adapters, endpoints, batch, tenant), all sharing one HTTP helper
(http.py: connection, errors, exit codes), one streaming upload (upload.py) and one printer (output.py).

Exit codes: 0 ok; 2 usage errors (argparse's, a missing profile, a bad argument); 3 a refusal by the server
(4xx; printed as `error <code> (param <param>): <message>`); 4 a server error (5xx) or an unreachable server.
"""
