"""The sections of the gateway's configuration file (:mod:`velvetrope.config`), one pydantic
model each: where it listens (:class:`Listen`), its engines (:class:`Upstream`, and the
gauges of an engine of no known dialect, :class:`EngineMetrics`), how it watches them
(:class:`FleetSettings`), where its shared state lives (:class:`StateSettings`), its
request handling (:class:`GatewaySettings`) and the engines' autoscaler as the simulator
models it (:class:`AutoscaleSettings`).  Every model forbids unknown keys and is frozen.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from velvetrope.dialects import DIALECTS, ENGINE_CHOICES, Dialect, custom_dialect, parse_gauge

__all__ = [
    "AutoscaleSettings",
    "EngineMetrics",
    "FleetSettings",
    "GatewaySettings",
    "Listen",
    "StateSettings",
    "Upstream",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Model):
    """Where the gateway listens."""

    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0: any free port)")


class EngineMetrics(_Model):
    """The gauges of an engine of no known dialect, each a metric name with the labels a
    sample must carry, e.g. ``queue_depth{model="llama"}`` (:func:`velvetrope.dialects.
    parse_gauge`).  Samples of a gauge are summed over label sets (KV usage: the largest)."""

    running: str = Field(description="requests the engine runs now")
    waiting: str = Field(description="requests queued in the engine")
    kv_usage: str | None = Field(None, description="KV-cache usage (absent: not read)")
    kv_unit: Literal["ratio", "percent"] = Field(
        "ratio", description="ratio: 0..1 (1 is full); percent: 0..100"
    )

    @field_validator("running", "waiting", "kv_usage")
    @classmethod
    def _gauge(cls, v: str | None) -> str | None:
        if v is not None:
            parse_gauge(v)  # raises ValueError saying what is wrong
        return v

    def dialect(self) -> Dialect:
        """The :class:`~velvetrope.dialects.Dialect` these gauges make (named ``custom``)."""
        return custom_dialect(
            self.running, self.waiting, self.kv_usage, kv_percent=self.kv_unit == "percent"
        )


class Upstream(_Model):
    """One OpenAI-compatible engine, or (``discovery: dns``) every address of a DNS name.

    With ``dns`` the URL's host is re-resolved every ``gateway.fleet.dns_refresh_s``: each
    address (A and AAAA records) is one engine at the URL's scheme and port, so a
    Kubernetes headless Service (``clusterIP: None``, whose name resolves to the addresses
    of its ready pods; kubernetes.io/docs/concepts/services-networking/dns-pod-service/)
    finds engines as they are scaled.  Addresses that disappear leave the pool once their
    requests finish.  CoreDNS caches answers (``cache 30`` and the kubernetes plugin's
    ``ttl 30`` by default), so a new pod is seen within about 30 s plus one refresh.
    """

    url: str = Field(
        pattern=r"^https?://",
        description="base URL, e.g. http://10.0.0.5:8000 (a trailing /v1 is dropped: the "
        "gateway adds /v1/chat/completions, /health and /metrics to the engine's root)",
    )
    metrics_url: str | None = Field(
        None, pattern=r"^https?://", description="Prometheus endpoint; default url + /metrics"
    )
    discovery: Literal["static", "dns"] = Field(
        "static", description="static: this URL; dns: one engine per address of its host"
    )
    engine: str = Field(
        "auto",
        description="the engine's metric dialect (velvetrope.dialects): auto (detected from "
        "its /metrics), vllm, sglang, tgi, trtllm, llamacpp; none: it has no /metrics to "
        "read, it is served without saturation",
    )
    engine_metrics: EngineMetrics | None = Field(
        None, description="the gauges to read, for an engine of no known dialect"
    )
    health_path: str | None = Field(
        None,
        pattern=r"^/",
        description="the liveness check's path (200: alive); unset: /health, or /v1/models "
        "when the engine answers /health with 404",
    )
    api_key_env: str | None = Field(
        None,
        min_length=1,
        description="environment variable holding the engine's API key, sent to it as "
        "Authorization: Bearer (requests, health checks, metrics)",
    )
    ca_bundle: str | None = Field(
        None, description="https: PEM file of the CA certificates to trust (default: the system's)"
    )
    tls_verify: bool = Field(
        True, description="https: verify the engine's certificate and host name"
    )
    priority: Literal["auto", "low_first", "high_first", "off"] = Field(
        "auto",
        description="how a pool with engine_priority sends the tier as this engine's "
        "request 'priority': low_first (vLLM's --scheduling-policy priority: 0 = the top "
        "tier, lower served first), high_first (SGLang's --enable-priority-scheduling, "
        "whose default serves larger values first: 0 = the top tier, -1 the next), off; "
        "auto: high_first for an engine pinned or detected as sglang, off for tgi, trtllm "
        "and llamacpp (they have no such field), else low_first.  An engine that refuses "
        "the field is found out on its first refusal and served without it "
        "(velvetrope.gateway.upstream.priority_forwarding)",
    )

    @field_validator("url")
    @classmethod
    def _root(cls, v: str) -> str:
        root = v.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        if v not in ENGINE_CHOICES:
            raise ValueError(f"unknown engine {v!r}: choose one of {', '.join(ENGINE_CHOICES)}")
        return v

    @model_validator(mode="after")
    def _one_dialect(self) -> Upstream:
        if self.engine_metrics is not None and self.engine != "auto":
            raise ValueError(
                f"give engine ({self.engine!r}) or engine_metrics, not both: engine_metrics "
                "names the gauges of an engine of no known dialect"
            )
        return self

    def dialect(self) -> Dialect | None:
        """The dialect this upstream is read in: the configured one, the one its
        ``engine_metrics`` spell, or ``None`` (``auto``: detected; ``none``: not read)."""
        if self.engine_metrics is not None:
            return self.engine_metrics.dialect()
        return next((d for d in DIALECTS if d.name == self.engine), None)


class FleetSettings(_Model):
    """How the gateway watches its engines: health, discovery, circuit breakers."""

    health_interval_s: float = Field(2.0, gt=0, description="active /health checks")
    health_timeout_s: float = Field(2.0, gt=0, description="a check slower than this fails")
    dns_refresh_s: float = Field(5.0, gt=0, description="re-resolve discovery: dns upstreams")
    breaker_failures: int = Field(
        3, ge=1, description="failed requests in a row that take an engine out"
    )
    breaker_open_s: float = Field(
        5.0, gt=0, description="out this long, then one probe request may bring it back"
    )


class StateSettings(_Model):
    """Where bucket levels and fleet-wide slot leases live.

    ``memory://`` (the default) keeps them in this process: one gateway, one worker.
    A Redis URL shares them across every replica and worker that names the same Redis and
    ``namespace``: limits hold for the fleet, not per replica.  ``redis://``, ``rediss://``
    and ``unix://`` name one server; ``redis+sentinel://h:p[,h:p]/service`` a Sentinel-
    managed master; ``redis+cluster://h:p[,h:p]`` a Redis Cluster (or Valkey).
    """

    url: str = Field(
        "memory://",
        pattern=r"^(memory://|redis://|rediss://|unix://|redis\+sentinel://|redis\+cluster://)",
        description="memory:// or a Redis URL",
    )
    password_env: str | None = Field(
        None, description="environment variable holding the Redis password (if not in url)"
    )
    namespace: str = Field(
        "velvetrope",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="prefix of every key: one per deployment sharing a Redis",
    )
    call_timeout_ms: float = Field(
        25.0, gt=0, description="budget of one Redis call, event-loop delay included"
    )
    on_store_error: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="Redis unreachable: fail_open = local limits at 1/N (N live replicas); "
        "fail_closed = 503 state_unavailable",
    )
    expected_replicas: int | None = Field(
        None,
        ge=1,
        description="fail_open before Redis ever answered: divide limits by this many "
        "replicas (unset: refuse with 503 state_unavailable until Redis first answers)",
    )
    breaker_failures: int = Field(3, ge=1, description="failed calls in a row that open it")
    breaker_reset_s: float = Field(0.5, gt=0, description="open this long before a probe")
    heartbeat_s: float = Field(1.0, gt=0, description="replica heartbeat (and probe) period")
    lease_ttl_s: float = Field(
        30.0, gt=0, description="a slot lease expires this long after its last renewal"
    )
    hold_ttl_s: float = Field(
        6 * 3600.0, gt=0, description="a reservation not settled this long is forgotten"
    )
    response_ttl_s: float = Field(
        24 * 3600.0,
        gt=0,
        description="with Redis state: how long the engine that created a Responses API "
        "response is remembered for previous_response_id (shared by every replica)",
    )

    @property
    def shared(self) -> bool:
        """Whether state lives outside this process."""
        return not self.url.startswith("memory://")


class GatewaySettings(_Model):
    """Request handling limits and defaults.

    ``request_timeout_s`` bounds how long a request may take to arrive, head and body,
    counted from its first byte (and how long a new connection may stay silent): a client
    that sends part of a request and stalls gets 408 ``request_timeout`` in OpenAI's error
    shape and its connection is closed, so it cannot hold a connection (and its memory)
    open forever.  The body is read before admission, so such a request never reserves
    tokens nor takes a slot.  A positive, finite number of seconds; the default (30 s) lets
    a slow client send a full ``max_body_bytes`` body over a link of under 50 KB/s.
    """

    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger bodies get 413")
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="a request not in full (head and body) this long after its first byte "
        "gets 408 (the connection is closed)",
    )
    max_tokens_limit: int = Field(32_768, ge=1, description="larger max_tokens get 400")
    unknown_parameters: Literal["pass", "refuse"] = Field(
        "pass",
        description="request fields the gateway does not read (other than model, messages/"
        "prompt, n, best_of, max_tokens/max_completion_tokens, stream, stream_options, "
        "logprobs/top_logprobs, ...): pass = sent to the engine untouched (the OpenAI SDK's "
        "newer create() fields, engine extras sent through extra_body: the engine uses or "
        "refuses them); refuse = 400 unknown_parameter for any top-level field outside "
        "OpenAI's and vLLM's known ones",
    )
    default_max_tokens: int = Field(1024, ge=1, description="when the request names none")
    other_paths: Literal["refuse", "pass"] = Field(
        "refuse",
        description="/tokenize, /detokenize, /v1/audio/* and any other /v1/ path the gateway "
        "does not meter: refuse = 404 not_found (the default: the gateway cannot tell what "
        "such a call costs an engine, and a path forwarded unmetered is a path around every "
        "budget); pass = forwarded to an upstream of the pool with request-count admission "
        "(API key, queue, tier, a slot, other_paths_cost_tokens from the tenant's bucket)",
    )
    other_paths_cost_tokens: int = Field(
        1, ge=1, description="what one passed-through request costs the tenant's buckets"
    )
    tokenizer: str = Field(
        "approx", description="prompt token counting: approx, cl100k_base, o200k_base, hf:PATH"
    )
    priority_header: str = Field("x-velvetrope-tier", description="header asking for a tier")
    progress_interval_s: float = Field(
        2.0,
        gt=0,
        description="a queued streaming request with progress on gets an SSE comment this "
        "often (the first after this long: short waits commit nothing)",
    )
    upstream_connect_timeout_s: float = Field(
        5.0, gt=0, description="connecting to an engine longer than this fails the request"
    )
    upstream_read_timeout_s: float = Field(600.0, gt=0, description="between bytes")
    drain_grace_s: float = Field(30.0, ge=0, description="SIGTERM: finish in-flight work this long")
    drain_notice_s: float = Field(
        2.0,
        ge=0,
        description="SIGTERM: keep answering (503 draining, /readyz 503) at least this long,"
        " even when nothing is in flight, so a load balancer polling /readyz stops sending"
        " before the listener closes (SIGINT skips it)",
    )
    metrics_tenant_label: bool = Field(False, description="label metrics by tenant (cardinality!)")
    reload_watch_s: float | None = Field(
        None,
        gt=0,
        description="reload when the config file's content changes, checked this often (a "
        "mounted ConfigMap); null: only on SIGHUP and POST /admin/reload",
    )
    admission: bool = Field(True, description="false: a pure proxy (for benchmarks)")
    fleet: FleetSettings = Field(default_factory=FleetSettings)


class AutoscaleSettings(_Model):
    """The engines' autoscaler, as ``velvetrope simulate --autoscale`` models it: the numbers
    of the KEDA ScaledObject that scales the pool's engine Deployment (``deploy/keda``), by
    the same names in snake case, and how long a new engine takes to serve.  The gateway
    itself does not read this section."""

    pool: str | None = Field(None, description="the pool whose engines scale (default: first)")
    query: str = Field(
        'sum(avg_over_time(velvetrope_queue_depth{pool="default"}[1m]))',
        description="the Prometheus trigger's query: velvetrope_queue_depth, "
        "vllm:num_requests_waiting, vllm:kv_cache_usage_perc, DCGM_FI_DEV_GPU_UTIL, "
        "instant or avg_over_time(...[w])",
    )
    threshold: float = Field(gt=0, description="target per replica (AverageValue) or total")
    activation_threshold: float = Field(0.0, description="KEDA activationThreshold (0 <-> 1)")
    metric_type: Literal["AverageValue", "Value"] = Field(
        "AverageValue",
        description="the trigger's metricType: threshold per replica (AverageValue) or total",
    )
    min_replicas: int = Field(1, ge=0, description="minReplicaCount")
    max_replicas: int = Field(100, ge=1, description="maxReplicaCount")
    polling_interval_s: float = Field(30.0, gt=0, description="pollingInterval")
    cooldown_s: float = Field(300.0, ge=0, description="cooldownPeriod (scale to zero only)")
    use_cached_metrics: bool = Field(False, description="the trigger's useCachedMetrics")
    behavior: dict[str, Any] | None = Field(
        None, description="advanced.horizontalPodAutoscalerConfig.behavior, as in the HPA"
    )
    sync_period_s: float = Field(15.0, gt=0, description="the HPA controller's sync period")
    scrape_interval_s: float = Field(15.0, gt=0, description="Prometheus' scrape interval")
    startup: str = Field(
        "120", description="start-up delay: SECONDS, LO-HI or lognormal:MEDIAN:SIGMA"
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        return self
