"""``aiayn serve``: one checkpoint behind OpenAI's HTTP API, its requests decoded in one continuous batch.

- :mod:`aiayn.serve.api`: the endpoints and their wire format;
- :mod:`aiayn.serve.engine`: the one thread that runs the model;
- :mod:`aiayn.serve.model`: the checkpoint as the server uses it (text in and out, batched translations and
  embeddings);
- :mod:`aiayn.serve.chat`: chat templates;
- :mod:`aiayn.serve.metrics`: ``/metrics``; :mod:`aiayn.serve.errors`: a refused request;
- :mod:`aiayn.serve.server`: starting, draining on SIGTERM, stopping.
"""
