"""Compiling off the serving process: worker processes with per-job deadlines (``pool``, ``worker``, ``ipc``)
and what a worker does with one constraint (``job``: translate, choose a backend, build); what it sends back
(``messages``: typed frames and artifacts). Nothing here imports torch."""
