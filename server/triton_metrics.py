"""Triton's metric families on /metrics, beside segfuse's own, so that Triton's dashboards and alerts
read segfuse: the per-model inference families, from the same records as the statistics route
(server/stats.py `StatsRecorder.counts`), and the GPU families of a server on a GPU (none on NumPy,
as Triton without GPUs has none).

Names, types, labels, HELP texts and units are Triton 2.51's, as its metrics port serves them:
counters named without `_total` (prometheus-cpp's exposition), durations in whole microseconds,
`nv_inference_request_failure` by `reason` (OTHER, CANCELED, BACKEND, REJECTED, each listed). That
naming is why this block is written here and not by prometheus_client, whose exposition always adds
`_total` to a counter's samples and TYPE line; prometheus_client's parser reads both the same.
"""

from __future__ import annotations

from prometheus_client.utils import floatToGoString

from .stats import FAILURE_REASONS, FusionCounts

# (name, HELP, the statistics' duration it sums or the count it is)
INFERENCE_FAMILIES = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "fail"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)", "inference_count"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     "execution_count"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds "
     "(includes cached requests)", "success"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds "
     "(includes cached requests)", "queue"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds "
     "(does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds "
     "(does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds "
     "(does not include cached requests)", "compute_output"),
)
# (name, HELP, the key of server/gpu_info.py usage)
GPU_FAMILIES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "total_bytes"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "used_bytes"),
)


def _labels(**labels: str) -> str:
    """A sample's label set, names sorted (as Triton's), values escaped as the text format wants."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _value(x) -> str:
    return str(x) if isinstance(x, int) else floatToGoString(x)


def _head(lines: list, name: str, help: str, kind: str) -> None:
    lines.append(f"# HELP {name} {help}")
    lines.append(f"# TYPE {name} {kind}")


def exposition(models: list[FusionCounts], version: str, gpus: list[dict]) -> bytes:
    """The Triton families' text: one sample per model (label `model`: the fusion's name; `version`)
    in each inference family, GPU families only for `gpus` (server/gpu_info.py usage) and only their
    values that could be read."""
    lines: list[str] = []
    for name, help, source in INFERENCE_FAMILIES:
        _head(lines, name, help, "counter")
        for m in models:
            if source == "fail":
                for reason in FAILURE_REASONS:
                    lines.append(f"{name}{{{_labels(model=m.name, reason=reason, version=version)}}} "
                                 f"{m.failures[reason]}")
                continue
            if source in ("inference_count", "execution_count"):
                value = getattr(m, source)
            elif name == "nv_inference_request_success":
                value = m.counts["success"]
            else:
                value = m.ns[source] // 1000  # Triton's unit: whole microseconds
            lines.append(f"{name}{{{_labels(model=m.name, version=version)}}} {value}")
    for name, help, key in GPU_FAMILIES:
        read = [(g["uuid"], g[key]) for g in gpus if g.get(key) is not None]
        if read:
            _head(lines, name, help, "gauge")
            lines.extend(f"{name}{{{_labels(gpu_uuid=uuid)}}} {_value(v)}" for uuid, v in read)
    return ("\n".join(lines) + "\n").encode() if lines else b""
