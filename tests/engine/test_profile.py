"""Engine profiles: built-ins, YAML round trips, validation errors, the step-time formula."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.engine import EngineProfile, list_profiles, load_profile, profile_to_yaml
from velvetrope.errors import ConfigError, PolicyError

BUILTINS = (
    "llama3-8b-h100",
    "llama3-70b-4xh100",
    "llama3-8b-a100",
    "llama3-8b-h100-vllm-v0",
    "llama3-70b-4xh100-vllm-v0",
    "llama3-8b-a100-vllm-v0",
    "llama3-8b-h100-vllm-v1",
    "llama3-70b-4xh100-vllm-v1",
)

VALID_YAML = """\
name: tiny
description: a test profile
step_base_s: 0.01
per_prefill_token_s: 0.001
per_decode_seq_s: 0.002
per_context_token_s: 0.0001
block_size: 16
num_gpu_blocks: 64
max_num_seqs: 8
max_num_batched_tokens: 64
max_model_len: 1024
"""


def _tiny() -> EngineProfile:
    return EngineProfile(
        name="tiny",
        description="a test profile",
        step_base_s=0.01,
        per_prefill_token_s=0.001,
        per_decode_seq_s=0.002,
        per_context_token_s=0.0001,
        block_size=16,
        num_gpu_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=1024,
    )


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _replace_line(key: str, value: str) -> str:
    lines = [
        f"{key}: {value}" if ln.startswith(f"{key}:") else ln for ln in VALID_YAML.splitlines()
    ]
    return "\n".join(lines) + "\n"


# -- built-ins ---------------------------------------------------------------------------


def test_list_profiles_names_every_shipped_file() -> None:
    assert set(BUILTINS) <= set(list_profiles())
    assert list_profiles() == sorted(list_profiles())


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_profiles_load_and_are_self_consistent(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert p.block_size == 16
    assert p.kv_capacity_tokens() == p.block_size * p.num_gpu_blocks
    assert p.max_model_len <= p.kv_capacity_tokens()
    # Ballpark sanity of the derived numbers: a decode step of one short sequence takes
    # milliseconds (weights are streamed once), and a full-budget prefill is slower.
    single = p.step_time(0, 1, 1000)
    assert 0.003 < single < 0.05
    assert p.step_time(p.max_num_batched_tokens, 0, p.max_num_batched_tokens) > single


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_profile_files_document_their_sources(name: str) -> None:
    text = resources.files("velvetrope.engine").joinpath(f"profiles/{name}.yaml").read_text()
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any(ln.startswith("# sources:") for ln in comments)
    body = "\n".join(comments)
    for field in ("step_base_s", "per_prefill_token_s", "per_decode_seq_s"):
        assert f"{field}:" in body, f"{name}.yaml does not explain {field}"
    assert "per_context_token_s:" in body
    assert "num_gpu_blocks:" in body
    assert "estimate" in body


def test_h100_is_faster_than_a100_for_the_same_model() -> None:
    h100, a100 = load_profile("llama3-8b-h100"), load_profile("llama3-8b-a100")
    for batch in ((512, 0, 512), (0, 64, 64_000), (0, 1, 100)):
        assert h100.step_time(*batch) < a100.step_time(*batch)


def test_unknown_profile_name_is_a_policy_error_listing_builtins() -> None:
    with pytest.raises(PolicyError, match="llama3-8b-h100") as info:
        load_profile("gpt-9-on-a-toaster")
    assert "gpt-9-on-a-toaster" in str(info.value)


def test_missing_profile_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_profile(str(missing))


# -- YAML round trip ---------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    p = load_profile(name)
    assert load_profile(str(_write(tmp_path, profile_to_yaml(p)))) == p


def test_awkward_values_round_trip(tmp_path: Path) -> None:
    p = _tiny().with_overrides(
        name="yes",  # a YAML 1.1 boolean if written unquoted
        description="multi-line: with a colon\nand # not a comment",
        step_base_s=1e-300,
        per_prefill_token_s=0.1 + 0.2,  # not exactly representable in short decimal
        per_context_token_s=0,
        max_model_len=1024,
    )
    back = load_profile(str(_write(tmp_path, profile_to_yaml(p))))
    assert back == p
    assert back.per_prefill_token_s == 0.1 + 0.2
    assert isinstance(back.per_context_token_s, float)


def test_loading_a_path_with_a_yml_suffix(tmp_path: Path) -> None:
    assert load_profile(str(_write(tmp_path, VALID_YAML, "tiny.yml"))) == _tiny()


# -- validation of YAML files ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (VALID_YAML + "max_batch_size: 12\n", "max_batch_size"),
        (VALID_YAML.replace("block_size: 16\n", ""), "block_size"),
        (_replace_line("block_size", "sixteen"), "block_size"),
        (_replace_line("block_size", "16.5"), "block_size"),
        (_replace_line("num_gpu_blocks", "0"), "num_gpu_blocks"),
        (_replace_line("per_decode_seq_s", "-0.001"), "per_decode_seq_s"),
        (_replace_line("per_decode_seq_s", "true"), "per_decode_seq_s"),
        (_replace_line("per_context_token_s", ".inf"), "per_context_token_s"),
        (_replace_line("step_base_s", "0"), "step_base_s"),
        (_replace_line("max_model_len", "1025"), "max_model_len"),
        (_replace_line("max_num_batched_tokens", "4"), "max_num_batched_tokens"),
        (_replace_line("name", '""'), "name"),
        (VALID_YAML + "scheduler: sglang\n", "scheduler"),
        (VALID_YAML + "num_scheduler_steps: 4\n", "num_scheduler_steps"),
        (VALID_YAML + "scheduler: vllm-v0\nnum_scheduler_steps: 0\n", "num_scheduler_steps"),
    ],
)
def test_bad_field_errors_name_the_file_and_the_field(
    tmp_path: Path, text: str, field: str
) -> None:
    path = _write(tmp_path, text, "bad-profile.yaml")
    with pytest.raises(ConfigError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert str(path) in message
    assert repr(field) in message


def test_capacity_error_explains_the_limit(tmp_path: Path) -> None:
    path = _write(tmp_path, _replace_line("max_model_len", "2000"))
    with pytest.raises(ConfigError, match=r"16 \* 64 = 1024"):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
        ("", "mapping"),
    ],
)
def test_malformed_files_are_config_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=needle) as info:
        load_profile(str(path))
    assert str(path) in str(info.value)


def test_numbers_written_without_a_dot_are_still_numbers(tmp_path: Path) -> None:
    # PyYAML reads `1e-3` as a string (YAML 1.1); a profile author means a number.
    p = load_profile(str(_write(tmp_path, _replace_line("per_prefill_token_s", "1e-3"))))
    assert p.per_prefill_token_s == 0.001


# -- construction in code ----------------------------------------------------------------


def test_direct_construction_validates() -> None:
    fields = dataclasses.asdict(_tiny())
    with pytest.raises(PolicyError, match="'block_size'"):
        EngineProfile(**{**fields, "block_size": 0})
    with pytest.raises(PolicyError, match="'max_model_len'"):
        EngineProfile(**{**fields, "num_gpu_blocks": 1})


def test_with_overrides_returns_a_validated_copy() -> None:
    base = _tiny()
    bigger = base.with_overrides(num_gpu_blocks=128, max_model_len=2048, step_base_s=1)
    assert (bigger.num_gpu_blocks, bigger.max_model_len) == (128, 2048)
    assert isinstance(bigger.step_base_s, float)
    assert base.num_gpu_blocks == 64  # the original is untouched
    with pytest.raises(PolicyError, match="'max_model_len'"):
        base.with_overrides(num_gpu_blocks=8)  # 128-token cache < max_model_len 1024
    with pytest.raises(PolicyError, match="'max_batch'"):
        base.with_overrides(max_batch=3)


# -- the step-time formula ---------------------------------------------------------------


def test_step_time_is_the_documented_formula() -> None:
    p = _tiny()
    assert p.step_time(0, 0, 0) == pytest.approx(0.01)
    assert p.step_time(100, 0, 0) == pytest.approx(0.01 + 0.1)
    assert p.step_time(0, 10, 0) == pytest.approx(0.01 + 0.02)
    assert p.step_time(0, 0, 1000) == pytest.approx(0.01 + 0.1)
    assert p.step_time(100, 10, 1000) == pytest.approx(0.01 + 0.1 + 0.02 + 0.1)


_counts = st.integers(min_value=0, max_value=100_000)


@settings(max_examples=100, deadline=None)
@given(_counts, _counts, _counts, _counts, _counts, _counts)
def test_step_time_is_linear_in_each_term(a: int, b: int, c: int, x: int, y: int, z: int) -> None:
    p = load_profile("llama3-8b-h100")
    base = p.step_time(0, 0, 0)
    # f(u + v) - base == (f(u) - base) + (f(v) - base): additive, one coefficient each.
    combined = p.step_time(a + x, b + y, c + z) - base
    separate = (p.step_time(a, b, c) - base) + (p.step_time(x, y, z) - base)
    assert combined == pytest.approx(separate, rel=1e-12, abs=1e-15)
    assert p.step_time(a, b, c) >= base


def test_each_engine_version_s_profile_names_its_scheduler() -> None:
    """The scheduler is part of a profile; the unsuffixed profiles keep the default."""
    for name in list_profiles():
        p = load_profile(name)
        if name.endswith("-vllm-v0"):
            assert (p.scheduler, p.num_scheduler_steps) == ("vllm-v0", 10), name
        else:
            assert (p.scheduler, p.num_scheduler_steps) == ("vllm-v1", 1), name
    v0 = load_profile("llama3-8b-h100-vllm-v0")
    assert v0.with_overrides(num_scheduler_steps=1).num_scheduler_steps == 1
    with pytest.raises(PolicyError, match="num_scheduler_steps"):
        v0.with_overrides(scheduler="vllm-v1")  # multi-step is V0's


def _vllm_default_seats_and_budget(p: EngineProfile) -> tuple[int, int]:
    """vLLM's own defaults for the engine version and GPU a built-in profile models.

    V0 (0.5-0.6, no chunked prefill): ``max_num_seqs`` 256 and a budget of
    ``max(max_model_len, 2048)``.  V1 ``vllm serve``: 1024 / 8192 on a GPU of 70 GiB or more
    that is not an A100, else 256 / 2048 (the profile files cite vLLM's source).
    """
    if p.scheduler == "vllm-v0":
        return 256, max(p.max_model_len, 2048)
    if "a100" in p.name:
        return 256, 2048
    return 1024, 8192


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_profiles_default_to_their_engine_version_s_seats_and_budget(name: str) -> None:
    p = load_profile(name)
    assert (p.max_num_seqs, p.max_num_batched_tokens) == _vllm_default_seats_and_budget(p)
    text = resources.files("velvetrope.engine").joinpath(f"profiles/{name}.yaml").read_text()
    assert "max_num_seqs" in text.split("\nname:")[0], "the header says where the seats come from"
