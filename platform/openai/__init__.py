"""The OpenAI-compatible surface: request and response bodies (``schemas``), the translation of requests into
engine inputs (``translate``), response bodies and server-sent events (``responses``), and the routes
(``controller``)."""
