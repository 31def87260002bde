"""Misuses pb_utils metrics as INPUT0 names it; OUTPUT0 is "<exception type>: <message>"."""

import numpy as np

import triton_python_backend_utils as pb_utils


def _negative_increment():
    family = pb_utils.MetricFamily("misuse_counter", "", pb_utils.MetricFamily.COUNTER)
    family.Metric().increment(-1)


def _observe_gauge():
    family = pb_utils.MetricFamily("misuse_gauge", "", pb_utils.MetricFamily.GAUGE)
    family.Metric().observe(1.0)


def _histogram_without_buckets():
    pb_utils.MetricFamily("misuse_histogram", "", pb_utils.MetricFamily.HISTOGRAM).Metric()


def _other_kind():
    pb_utils.MetricFamily("misuse_kind", "", pb_utils.MetricFamily.COUNTER)
    pb_utils.MetricFamily("misuse_kind", "", pb_utils.MetricFamily.GAUGE)


def _family_deleted():
    family = pb_utils.MetricFamily("misuse_deleted", "", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"a": "1"})
    del family
    metric.set(1.0)


CASES = {
    "negative_increment": _negative_increment,
    "observe_gauge": _observe_gauge,
    "histogram_without_buckets": _histogram_without_buckets,
    "other_kind": _other_kind,
    "family_deleted": _family_deleted,
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            case = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0].decode()
            try:
                CASES[case]()
                outcome = "no error"
            except Exception as exc:  # the type is what the test checks
                outcome = f"{type(exc).__name__}: {exc}"
            out = pb_utils.Tensor("OUTPUT0", np.array([outcome.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
