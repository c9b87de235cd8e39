"""``velvetrope engine``: run a simulated inference engine behind an OpenAI-compatible API.

Registered in :mod:`velvetrope.cli` as ``app.command("engine")(engine_command)``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from typing import Annotated, Literal

import typer

from velvetrope.engine.outputs import OutputPolicy, parse_lengths
from velvetrope.engine.profile import EngineProfile, load_profile
from velvetrope.errors import VelvetropeError

__all__ = ["engine_command", "parse_overrides"]

_BOOLS = {"true": True, "1": True, "yes": True, "on": True}
_BOOLS.update({"false": False, "0": False, "no": False, "off": False})


def parse_overrides(profile: EngineProfile, items: list[str]) -> EngineProfile:
    """Apply ``FIELD=VALUE`` overrides (``--set``) to ``profile``, typed by field.

    A boolean field takes ``true``/``false`` (also ``1``/``0``, ``yes``/``no``,
    ``on``/``off``), e.g. ``--set enable_prefix_caching=true``.  Raises
    :class:`~velvetrope.errors.PolicyError` for an unknown field or a bad value.
    """
    if not items:
        return profile
    types = {f.name: f.type for f in dataclasses.fields(profile)}
    kw: dict[str, float | int | str | bool] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq:
            raise typer.BadParameter(f"expected FIELD=VALUE, got {item!r}", param_hint="--set")
        kind = types.get(name)
        try:
            if kind in ("bool", bool):
                word = raw.strip().lower()
                if word not in _BOOLS:
                    raise ValueError(raw)
                kw[name] = _BOOLS[word]
            elif kind in ("int", int):
                kw[name] = int(raw)
            elif kind in ("float", float):
                kw[name] = float(raw)
            else:
                kw[name] = raw
        except ValueError:
            raise typer.BadParameter(
                f"{name}: {raw!r} is not a valid {kind}", param_hint="--set"
            ) from None
    return profile.with_overrides(**kw)


def engine_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8001,
    profile: Annotated[
        str, typer.Option(help="Engine profile: a built-in name or a YAML file.")
    ] = "llama3-8b-h100",
    speed: Annotated[
        float,
        typer.Option(help="Run K times faster than real time; 'inf' is the same as --instant."),
    ] = 1.0,
    model: Annotated[str, typer.Option(help="The model name served and required.")] = (
        "velvetrope-sim"
    ),
    tokenizer: Annotated[
        str,
        typer.Option(
            help="Prompt token counting: cl100k_base, o200k_base, approx, hf:PATH; auto: "
            "cl100k_base where bpe-openai is installed (velvetrope[tokenizers]), else approx."
        ),
    ] = "auto",
    instant: Annotated[
        bool, typer.Option(help="Zero model time: answer at once (a fast upstream).")
    ] = False,
    outputs: Annotated[
        str,
        typer.Option(
            help="Output-length distribution: lognormal[:median=M,p99=P], fixed:N, "
            "uniform:LOW:HIGH. Drawn deterministically from each prompt."
        ),
    ] = "lognormal:median=129,p99=600",
    seed: Annotated[int, typer.Option(help="Seed mixed into every output-length draw.")] = 0,
    scheduling: Annotated[
        str, typer.Option(help="Waiting-queue policy: fcfs or priority (vLLM's).")
    ] = "fcfs",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a profile field, e.g. --set num_gpu_blocks=2000 (repeatable).",
        ),
    ] = None,
    max_body_mb: Annotated[
        float, typer.Option(help="Largest request body accepted, in MiB (else 413).")
    ] = 8.0,
    faults: Annotated[
        bool,
        typer.Option(
            help='Answer a request body\'s "velvetrope_fault": STATUS with that status '
            "(fault injection for tests)."
        ),
    ] = False,
    metrics_dialect: Annotated[
        str,
        typer.Option(
            help="Whose metric names /metrics speaks: vllm, vllm-old (the older KV gauge "
            "name), sglang, tgi, trtllm (trtllm-serve), triton (Triton's TensorRT-LLM "
            "backend), llamacpp; none: no /metrics (404)."
        ),
    ] = "vllm",
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="VELVETROPE_ENGINE_API_KEY",
            help="Require 'Authorization: Bearer KEY' on /v1/ routes (as vLLM's --api-key).",
        ),
    ] = None,
    health: Annotated[
        bool, typer.Option(help="Serve GET /health (--no-health: 404, an engine without it).")
    ] = True,
    ssl_certfile: Annotated[
        str | None, typer.Option(help="Serve HTTPS with this PEM certificate (chain).")
    ] = None,
    ssl_keyfile: Annotated[
        str | None, typer.Option(help="The PEM private key of --ssl-certfile.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    journal: Annotated[
        str | None,
        typer.Option(
            help="Append a JSON line to this file when each request starts and ends "
            "(its times, tokens and end state; see velvetrope.engine.serve.journal)."
        ),
    ] = None,
) -> None:
    """Run a simulated inference engine with an OpenAI-compatible API and vLLM's metrics
    (or another engine's: --metrics-dialect).

    Prints one line, "velvetrope engine ready on URL ...", once it accepts connections.

    Exits 0 on SIGINT or SIGTERM, ending open streams with an error event.

    Responses carry the model's own predicted times in an extra "velvetrope" field.
    """
    from velvetrope.engine.serve.metrics import DIALECTS as METRICS_DIALECTS
    from velvetrope.engine.serve.server import run_engine

    if speed <= 0 or math.isnan(speed):
        raise typer.BadParameter("must be positive (or inf)", param_hint="--speed")
    if scheduling not in ("fcfs", "priority"):
        raise typer.BadParameter("must be fcfs or priority", param_hint="--scheduling")
    if metrics_dialect not in METRICS_DIALECTS:
        raise typer.BadParameter(
            f"must be one of {', '.join(METRICS_DIALECTS)}", param_hint="--metrics-dialect"
        )
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise typer.BadParameter("give both or neither", param_hint="--ssl-certfile/--ssl-keyfile")
    tls = (ssl_certfile, ssl_keyfile) if ssl_certfile and ssl_keyfile else None
    policy: Literal["fcfs", "priority"] = "priority" if scheduling == "priority" else "fcfs"
    effective_speed = math.inf if instant else speed
    if tokenizer == "auto":
        has_bpe = importlib.util.find_spec("bpe_openai") is not None
        tokenizer = "cl100k_base" if has_bpe else "approx"
    try:
        prof = parse_overrides(load_profile(profile), set_ or [])
        output_policy = OutputPolicy(parse_lengths(outputs), seed)

        def ready(url: str) -> None:
            mode = "instant" if math.isinf(effective_speed) else f"speed={effective_speed:g}"
            typer.echo(
                f"velvetrope engine ready on {url} model={model} profile={prof.name} "
                f"{mode} tokenizer={tokenizer} pid={os.getpid()}"
            )

        run_engine(
            host,
            port,
            prof,
            effective_speed,
            model,
            tokenizer,
            output_policy,
            scheduling=policy,
            max_body_bytes=int(max_body_mb * 1024 * 1024),
            faults=faults,
            metrics_dialect=metrics_dialect,
            journal=journal,
            api_key=api_key or None,
            health_route=health,
            tls=tls,
            on_ready=ready,
            log_level=log_level,
        )
    except VelvetropeError as exc:
        typer.echo(f"velvetrope engine: error: {exc}", err=True)
        raise typer.Exit(2) from None
