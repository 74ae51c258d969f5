"""``aiayn serve``: a checkpoint behind OpenAI's HTTP API (:mod:`aiayn.serve`)."""

from __future__ import annotations

import argparse
import os
import sys

from aiayn.cli.commands import _add_load_args, _load, command
from aiayn.cli.values import number, whole

API_KEY_ENV = "AIAYN_API_KEY"


@command("serve", "Serve a checkpoint over OpenAI's HTTP API (/v1/completions, /v1/chat/completions, /v1/embeddings, "
                  "/v1/models; /v1/translations for translation models; /health, /metrics), its requests decoded "
                  "together in one continuous batch (docs/serving.md). Works with the openai Python client.")
def _serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a checkpoint directory (trained, or converted from Hugging "
                                                       "Face with aiayn convert)")
    p.add_argument("--name", default=None, help="the model's name in the API (default: the checkpoint folder's)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1, this machine only; another address makes the model "
                        "reachable from the network: set an API key then). Requests must name the server by a "
                        "loopback name or this address; browsers' cross-site requests are refused")
    p.add_argument("--port", type=whole(0, 65535), default=8000,
                   help="port to serve on (default 8000; 0: any free port, named when serving starts)")
    p.add_argument("--max-batch", type=whole(1), default=16,
                   help="the most sequences decoding at once (default 16); more wait in the queue")
    p.add_argument("--max-queue", type=whole(1), default=256,
                   help="the most sequences waiting to join the batch (default 256); a request beyond it gets 429")
    p.add_argument("--prefill-chunk", type=whole(1), default=512,
                   help="the most prompt tokens prefilled per step (default 512), so a long prompt does not stall the "
                        "sequences already decoding")
    p.add_argument("--timeout", type=number(0, open_low=True), default=600.0,
                   help="seconds one request may run (default 600); then 504 and its decoding stops")
    p.add_argument("--grace", type=number(0), default=30.0,
                   help="seconds SIGTERM or Ctrl-C waits for the requests in flight before exiting (default 30)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/ (default: ${API_KEY_ENV} if set, else no key)")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        from aiayn.serve.api import Limits  # lazy: loaded when the command runs
        from aiayn.serve.server import serve

        pre = _load(args)
        key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None

        def ready(url: str) -> None:
            print(f"aiayn serve: {pre.task} model at {url}v1 (Ctrl-C or SIGTERM to stop)", file=sys.stderr,
                  flush=True)
        serve(pre, name=args.name, checkpoint=args.checkpoint, host=args.host, port=args.port,
              max_batch=args.max_batch, max_queue=args.max_queue, prefill_chunk=args.prefill_chunk, api_key=key,
              limits=Limits(timeout=args.timeout), grace=args.grace, on_ready=ready)
        return 0

    p.set_defaults(run=run)
