"""Engine performance profiles: how long one continuous-batching iteration takes.

An :class:`EngineProfile` is a linear model of one engine iteration (one forward pass of
the running batch) plus the scheduler limits that shape the batch::

    step_time = step_base_s
              + per_prefill_token_s * prefill_tokens   # prompt (or recompute) tokens
              + per_decode_seq_s    * decode_seqs      # sequences producing their next token
              + per_context_token_s * context_tokens   # KV-cache tokens attended by the batch

``step_base_s`` is the per-iteration floor (reading the weights once, kernel launches,
the scheduler's CPU work), ``per_prefill_token_s`` the compute cost of a prompt token,
``per_decode_seq_s`` the marginal cost of one more decoding sequence and
``per_context_token_s`` the cost of reading one cached token's K and V.

Optional terms (all default to "off", so older files load unchanged):

* **Tensor parallelism.**  With ``tensor_parallel_size > 1`` every layer ends in two
  all-reduces: ``tp_allreduce_s`` is their latency summed over a step (a constant per step)
  and ``tp_per_token_s`` their bandwidth cost per batched token (prefill tokens, decoding
  sequences and speculative verification tokens alike).  Both are added to the step.
* **Speculative decoding** (:mod:`velvetrope.engine.speculative`): ``spec_tokens = k > 0``
  draft tokens per decoding sequence and step, each accepted with probability
  ``spec_acceptance``; a step with ``n`` speculating sequences costs the target model
  ``k * n`` extra (verification) tokens at ``per_prefill_token_s + tp_per_token_s`` each,
  plus ``k * spec_draft_step_s`` for the ``k`` forward passes of the draft model.
* **Automatic prefix caching** (``enable_prefix_caching``): KV blocks of shared prompt
  prefixes are reused across sequences (:mod:`velvetrope.engine.prefix_cache`).

**Scheduling is part of the profile** (:data:`SCHEDULERS`): ``scheduler`` names the engine
scheduler the coefficients were fitted under and that every user of the profile (the
simulator, the engine server, the planner, calibration) runs, through the one
:class:`~velvetrope.engine.batcher.Batcher`:

* ``vllm-v1`` (the default): vLLM V1, chunked prefill, prompt chunks batched with decodes;
* ``vllm-v0``: vLLM 0.5-0.6 (V0) without chunked prefill: admitted prompts run whole in
  steps of their own while the running sequences wait; with ``num_scheduler_steps = k >
  1`` (vLLM 0.6's ``--num-scheduler-steps``, multi-step scheduling) waiting prompts join
  only every ``k`` steps while sequences are running.

``max_num_seqs`` and ``max_num_batched_tokens`` are the engine's seat count and per-step
token budget (vLLM's flags of those names); ``num_scheduler_steps`` is 1 except with
``vllm-v0``.

The built-in profiles (``profiles/*.yaml``, listed by :func:`list_profiles`) are fitted to
published vLLM benchmark results (``velvetrope/engine/data/published_vllm.csv``, see
:mod:`velvetrope.engine.fit_published`); each file says which source fixed which
coefficient.  Fit your own from a benchmark of your engine for serious planning.

Profiles load from YAML (:func:`load_profile`) and dump back (:func:`profile_to_yaml`)
losslessly.  Every profile is validated on construction: numbers finite, coefficients
non-negative, ``step_base_s > 0``, sizes ``>= 1``, ``max_num_batched_tokens >=
max_num_seqs``, ``num_scheduler_steps == 1`` unless ``scheduler`` is ``vllm-v0``, and
``max_model_len <= block_size * num_gpu_blocks`` (like vLLM, which
refuses to start when one full-length sequence cannot fit its KV cache).  A bad file raises
:class:`~velvetrope.errors.ConfigError` naming the file and the field; bad values passed in
code, or an unknown built-in name, raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from velvetrope.errors import ConfigError, PolicyError
from velvetrope.yaml_config import describe, load_model, read_text, reject_bool

__all__ = [
    "COEFFICIENTS",
    "SCHEDULERS",
    "EngineProfile",
    "Scheduler",
    "list_profiles",
    "load_profile",
    "profile_to_yaml",
]

_PROFILE_DIR = "profiles"
_SUFFIXES = (".yaml", ".yml")


_Seconds = Annotated[float, BeforeValidator(reject_bool), Field(ge=0.0, allow_inf_nan=False)]
_Count = Annotated[StrictInt, Field(ge=1)]
_Fraction = Annotated[float, BeforeValidator(reject_bool), Field(ge=0.0, le=1.0)]

Scheduler = Literal["vllm-v1", "vllm-v0"]
SCHEDULERS: tuple[Scheduler, ...] = ("vllm-v1", "vllm-v0")
"""The engine schedulers a profile can model (see the module docstring)."""


class _ProfileModel(BaseModel):
    """The validation schema shared by YAML files and :class:`EngineProfile` itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(min_length=1)]
    description: StrictStr
    step_base_s: Annotated[_Seconds, Field(gt=0.0)]
    per_prefill_token_s: _Seconds
    per_decode_seq_s: _Seconds
    per_context_token_s: _Seconds
    block_size: _Count
    num_gpu_blocks: _Count
    max_num_seqs: _Count
    max_num_batched_tokens: _Count
    max_model_len: _Count
    tensor_parallel_size: _Count = 1
    tp_allreduce_s: _Seconds = 0.0
    tp_per_token_s: _Seconds = 0.0
    enable_prefix_caching: StrictBool = False
    spec_tokens: Annotated[StrictInt, Field(ge=0, le=16)] = 0
    spec_acceptance: _Fraction = 0.0
    spec_draft_step_s: _Seconds = 0.0
    scheduler: Scheduler = "vllm-v1"
    num_scheduler_steps: _Count = 1

    @field_validator("num_scheduler_steps")
    @classmethod
    def _multistep_is_v0(cls, value: int, info: ValidationInfo) -> int:
        scheduler = info.data.get("scheduler")
        if value > 1 and scheduler is not None and scheduler != "vllm-v0":
            raise ValueError(
                f"multi-step scheduling (num_scheduler_steps > 1) is vLLM V0's; "
                f"scheduler is {scheduler!r}"
            )
        return value

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _budget_covers_seqs(cls, value: int, info: ValidationInfo) -> int:
        seqs = info.data.get("max_num_seqs")
        if seqs is not None and value < seqs:
            raise ValueError(
                f"must be >= max_num_seqs ({seqs}): every running sequence needs at least "
                f"one token of the per-step budget"
            )
        return value

    @field_validator("max_model_len")
    @classmethod
    def _fits_kv_cache(cls, value: int, info: ValidationInfo) -> int:
        block_size = info.data.get("block_size")
        blocks = info.data.get("num_gpu_blocks")
        if block_size is not None and blocks is not None and value > block_size * blocks:
            raise ValueError(
                f"must be <= the KV cache capacity block_size * num_gpu_blocks "
                f"({block_size} * {blocks} = {block_size * blocks} tokens)"
            )
        return value


COEFFICIENTS: tuple[str, ...] = (
    "step_base_s",
    "per_prefill_token_s",
    "per_decode_seq_s",
    "per_context_token_s",
)
"""The step time's four linear coefficients (the formula in the module docstring), in the
order of a coefficient vector: what a fit estimates and a replay's linear forms multiply."""

_FIELD_NAMES = tuple(_ProfileModel.model_fields)
_FLOAT_FIELDS = (
    *COEFFICIENTS,
    "tp_allreduce_s",
    "tp_per_token_s",
    "spec_acceptance",
    "spec_draft_step_s",
)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """A validated engine performance model; see the module docstring for the formula.

    Construction validates every field and raises :class:`~velvetrope.errors.PolicyError`
    naming the bad field.  Float coefficients are stored as ``float``.
    """

    name: str
    description: str
    step_base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    tensor_parallel_size: int = 1
    tp_allreduce_s: float = 0.0
    tp_per_token_s: float = 0.0
    enable_prefix_caching: bool = False
    spec_tokens: int = 0
    spec_acceptance: float = 0.0
    spec_draft_step_s: float = 0.0
    scheduler: Scheduler = "vllm-v1"
    num_scheduler_steps: int = 1

    def __post_init__(self) -> None:
        try:
            _ProfileModel.model_validate(self._as_dict())
        except ValidationError as exc:
            raise PolicyError(
                f"invalid engine profile {self.name!r}: {describe(exc, _ProfileModel)}"
            ) from None
        for field in _FLOAT_FIELDS:
            object.__setattr__(self, field, float(getattr(self, field)))

    def _as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int, verify_tokens: int = 0
    ) -> float:
        """Seconds one iteration takes for this batch composition (all arguments >= 0).

        ``verify_tokens`` counts the speculative draft tokens the target model verified in
        this step (0 without speculative decoding); when positive the step also pays
        ``spec_tokens * spec_draft_step_s`` for the draft model.  Linear in each argument;
        ``step_base_s + tp_allreduce_s`` even for an empty batch, so callers with no work
        should not call it (the batcher returns a zero-length step instead).
        """
        t = (
            self.step_base_s
            + self.tp_allreduce_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_seq_s * decode_seqs
            + self.per_context_token_s * context_tokens
            + self.tp_per_token_s * (prefill_tokens + decode_seqs)
        )
        if verify_tokens:
            t += (
                verify_tokens * (self.per_prefill_token_s + self.tp_per_token_s)
                + self.spec_tokens * self.spec_draft_step_s
            )
        return t

    @property
    def speculative(self) -> bool:
        """Whether speculative decoding is on (``spec_tokens > 0``)."""
        return self.spec_tokens > 0

    def kv_capacity_tokens(self) -> int:
        """Token slots in the KV cache: ``block_size * num_gpu_blocks``."""
        return self.block_size * self.num_gpu_blocks

    def with_overrides(self, **kw: float | int | str | bool) -> EngineProfile:
        """A validated copy with some fields replaced.

        Raises :class:`~velvetrope.errors.PolicyError` for a name that is not a field or a
        value that fails validation (for example ``max_model_len`` beyond the new cache).
        """
        unknown = sorted(set(kw) - set(_FIELD_NAMES))
        if unknown:
            raise PolicyError(
                f"unknown engine profile field(s) {', '.join(map(repr, unknown))}; "
                f"known fields: {', '.join(_FIELD_NAMES)}"
            )
        return EngineProfile(**{**self._as_dict(), **kw})


def _profile_dir() -> resources.abc.Traversable:
    return resources.files("velvetrope.engine").joinpath(_PROFILE_DIR)


def list_profiles() -> list[str]:
    """Names of the built-in profiles (the YAML files shipped in the package), sorted."""
    return sorted(
        entry.name.rsplit(".", 1)[0]
        for entry in _profile_dir().iterdir()
        if entry.is_file() and entry.name.endswith(_SUFFIXES)
    )


def _parse(text: str, source: str) -> EngineProfile:
    """Validate YAML ``text``; errors are ConfigErrors that start with ``source``."""
    model = load_model(_ProfileModel, text, source, "engine profile")
    return EngineProfile(**model.model_dump())


def load_profile(name_or_path: str) -> EngineProfile:
    """Load a built-in profile by name, or a profile YAML file by path.

    A built-in name wins over a file of the same name.  Raises
    :class:`~velvetrope.errors.PolicyError` for a name that is neither a built-in nor an
    existing file (the message lists the built-ins), and
    :class:`~velvetrope.errors.ConfigError` naming the file (and field) for a file that
    cannot be read, is not YAML, or fails validation.
    """
    if name_or_path in list_profiles():
        for suffix in _SUFFIXES:
            entry = _profile_dir().joinpath(name_or_path + suffix)
            if entry.is_file():
                return _parse(entry.read_text(encoding="utf-8"), f"built-in profile {entry.name}")
    path = Path(name_or_path)
    if path.is_file():
        return _parse(read_text(path, "engine profile"), str(path))
    if path.suffix in _SUFFIXES or len(path.parts) > 1:
        raise ConfigError(f"{path}: engine profile file not found")
    raise PolicyError(
        f"unknown engine profile {name_or_path!r}: not a built-in "
        f"({', '.join(list_profiles())}) and not a file"
    )


def profile_to_yaml(profile: EngineProfile) -> str:
    """Serialise ``profile`` as YAML that :func:`load_profile` reads back equal.

    Floats are written with Python's shortest round-tripping repr, so nothing is lost.
    """
    body = yaml.safe_dump(
        dataclasses.asdict(profile), sort_keys=False, allow_unicode=True, width=100
    )
    return f"# velvetrope engine profile {profile.name!r} (see velvetrope.engine.profile)\n{body}"
