from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
SETTING_DEFAULT_FIELD_NUMBER: _ClassVar[int]
setting_default: _descriptor.FieldDescriptor
SETTING_RANGE_FIELD_NUMBER: _ClassVar[int]
setting_range: _descriptor.FieldDescriptor

class Settings(_message.Message):
    __slots__ = ("policy", "threshold", "threshold_on", "min_verify_length", "max_verify_length", "budget_fraction", "max_batch_tokens", "sps_table", "sts_temperatures", "trace_round_ratio", "probe_round_ratio", "auto_refit_ece", "auto_refit_min_samples", "drafting")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_ON_FIELD_NUMBER: _ClassVar[int]
    MIN_VERIFY_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_VERIFY_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPS_TABLE_FIELD_NUMBER: _ClassVar[int]
    STS_TEMPERATURES_FIELD_NUMBER: _ClassVar[int]
    TRACE_ROUND_RATIO_FIELD_NUMBER: _ClassVar[int]
    PROBE_ROUND_RATIO_FIELD_NUMBER: _ClassVar[int]
    AUTO_REFIT_ECE_FIELD_NUMBER: _ClassVar[int]
    AUTO_REFIT_MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DRAFTING_FIELD_NUMBER: _ClassVar[int]
    policy: str
    threshold: float
    threshold_on: str
    min_verify_length: int
    max_verify_length: int
    budget_fraction: float
    max_batch_tokens: int
    sps_table: str
    sts_temperatures: _containers.RepeatedScalarFieldContainer[float]
    trace_round_ratio: float
    probe_round_ratio: float
    auto_refit_ece: float
    auto_refit_min_samples: int
    drafting: str
    def __init__(self, policy: _Optional[str] = ..., threshold: _Optional[float] = ..., threshold_on: _Optional[str] = ..., min_verify_length: _Optional[int] = ..., max_verify_length: _Optional[int] = ..., budget_fraction: _Optional[float] = ..., max_batch_tokens: _Optional[int] = ..., sps_table: _Optional[str] = ..., sts_temperatures: _Optional[_Iterable[float]] = ..., trace_round_ratio: _Optional[float] = ..., probe_round_ratio: _Optional[float] = ..., auto_refit_ece: _Optional[float] = ..., auto_refit_min_samples: _Optional[int] = ..., drafting: _Optional[str] = ...) -> None: ...

class State(_message.Message):
    __slots__ = ("settings", "version", "gamma", "last_rejection", "sps_table_source", "drafter")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    LAST_REJECTION_FIELD_NUMBER: _ClassVar[int]
    SPS_TABLE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    settings: Settings
    version: int
    gamma: int
    last_rejection: str
    sps_table_source: str
    drafter: Drafter
    def __init__(self, settings: _Optional[_Union[Settings, _Mapping]] = ..., version: _Optional[int] = ..., gamma: _Optional[int] = ..., last_rejection: _Optional[str] = ..., sps_table_source: _Optional[str] = ..., drafter: _Optional[_Union[Drafter, _Mapping]] = ...) -> None: ...

class Drafter(_message.Message):
    __slots__ = ("path", "version", "loaded_at_unix_s", "swaps")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SWAPS_FIELD_NUMBER: _ClassVar[int]
    path: str
    version: str
    loaded_at_unix_s: float
    swaps: int
    def __init__(self, path: _Optional[str] = ..., version: _Optional[str] = ..., loaded_at_unix_s: _Optional[float] = ..., swaps: _Optional[int] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateStateRequest(_message.Message):
    __slots__ = ("settings", "update_mask", "expected_version", "validate_only")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    settings: Settings
    update_mask: _field_mask_pb2.FieldMask
    expected_version: int
    validate_only: bool
    def __init__(self, settings: _Optional[_Union[Settings, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., expected_version: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class UpdateStateResponse(_message.Message):
    __slots__ = ("state", "applied")
    STATE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    state: State
    applied: bool
    def __init__(self, state: _Optional[_Union[State, _Mapping]] = ..., applied: _Optional[bool] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("to_version", "expected_version")
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    to_version: int
    expected_version: int
    def __init__(self, to_version: _Optional[int] = ..., expected_version: _Optional[int] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("version", "caller", "time_unix_s", "action", "settings")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    version: int
    caller: str
    time_unix_s: float
    action: str
    settings: Settings
    def __init__(self, version: _Optional[int] = ..., caller: _Optional[str] = ..., time_unix_s: _Optional[float] = ..., action: _Optional[str] = ..., settings: _Optional[_Union[Settings, _Mapping]] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ...) -> None: ...

class WatchStateRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class ServingStats(_message.Message):
    __slots__ = ("interval_s", "rounds", "tau", "verify_budget_per_request", "drafts_verified", "goodput_tok_s", "step_overhead_s", "state_version", "ece_by_position", "survival_gap_by_position", "calibration_samples", "probe_rounds", "sps_table_error_ratio")
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BUDGET_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_TOK_S_FIELD_NUMBER: _ClassVar[int]
    STEP_OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ECE_BY_POSITION_FIELD_NUMBER: _ClassVar[int]
    SURVIVAL_GAP_BY_POSITION_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROBE_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SPS_TABLE_ERROR_RATIO_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    rounds: int
    tau: float
    verify_budget_per_request: float
    drafts_verified: int
    goodput_tok_s: float
    step_overhead_s: float
    state_version: int
    ece_by_position: _containers.RepeatedScalarFieldContainer[float]
    survival_gap_by_position: _containers.RepeatedScalarFieldContainer[float]
    calibration_samples: int
    probe_rounds: int
    sps_table_error_ratio: float
    def __init__(self, interval_s: _Optional[float] = ..., rounds: _Optional[int] = ..., tau: _Optional[float] = ..., verify_budget_per_request: _Optional[float] = ..., drafts_verified: _Optional[int] = ..., goodput_tok_s: _Optional[float] = ..., step_overhead_s: _Optional[float] = ..., state_version: _Optional[int] = ..., ece_by_position: _Optional[_Iterable[float]] = ..., survival_gap_by_position: _Optional[_Iterable[float]] = ..., calibration_samples: _Optional[int] = ..., probe_rounds: _Optional[int] = ..., sps_table_error_ratio: _Optional[float] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("state", "stats")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    state: State
    stats: ServingStats
    def __init__(self, state: _Optional[_Union[State, _Mapping]] = ..., stats: _Optional[_Union[ServingStats, _Mapping]] = ...) -> None: ...

class ProfileSpsRequest(_message.Message):
    __slots__ = ("from_traffic", "min_samples")
    FROM_TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    from_traffic: bool
    min_samples: int
    def __init__(self, from_traffic: _Optional[bool] = ..., min_samples: _Optional[int] = ...) -> None: ...

class ProfileSpsResponse(_message.Message):
    __slots__ = ("state", "sps_table", "sample_batch_tokens", "sample_steps_per_sec")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPS_TABLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_STEPS_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    state: State
    sps_table: str
    sample_batch_tokens: _containers.RepeatedScalarFieldContainer[int]
    sample_steps_per_sec: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, state: _Optional[_Union[State, _Mapping]] = ..., sps_table: _Optional[str] = ..., sample_batch_tokens: _Optional[_Iterable[int]] = ..., sample_steps_per_sec: _Optional[_Iterable[float]] = ...) -> None: ...

class CalibrateRequest(_message.Message):
    __slots__ = ("min_samples", "expected_version")
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    min_samples: int
    expected_version: int
    def __init__(self, min_samples: _Optional[int] = ..., expected_version: _Optional[int] = ...) -> None: ...

class CalibrateResponse(_message.Message):
    __slots__ = ("state", "ece_before", "samples")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ECE_BEFORE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    state: State
    ece_before: _containers.RepeatedScalarFieldContainer[float]
    samples: int
    def __init__(self, state: _Optional[_Union[State, _Mapping]] = ..., ece_before: _Optional[_Iterable[float]] = ..., samples: _Optional[int] = ...) -> None: ...

class RestartRequest(_message.Message):
    __slots__ = ("timeout_s",)
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    def __init__(self, timeout_s: _Optional[float] = ...) -> None: ...

class RestartResponse(_message.Message):
    __slots__ = ("state", "seconds", "starts")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    state: State
    seconds: float
    starts: int
    def __init__(self, state: _Optional[_Union[State, _Mapping]] = ..., seconds: _Optional[float] = ..., starts: _Optional[int] = ...) -> None: ...

class LoadDrafterRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class LoadDrafterResponse(_message.Message):
    __slots__ = ("drafter", "previous", "seconds")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    drafter: Drafter
    previous: Drafter
    seconds: float
    def __init__(self, drafter: _Optional[_Union[Drafter, _Mapping]] = ..., previous: _Optional[_Union[Drafter, _Mapping]] = ..., seconds: _Optional[float] = ...) -> None: ...
