"""Counts its requests and input values in its own metric families; OUTPUT0 = INPUT0."""

import triton_python_backend_utils as pb_utils

BUCKETS = [1.0, 2.5, 10.0]


class TritonPythonModel:
    def initialize(self, args):
        # The families are kept: in Triton a metric stops working once its family is gone.
        self.families = requests, last_sum, values = (
            pb_utils.MetricFamily(
                "custom_metrics_requests", "Requests executed", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(
                "custom_metrics_last_sum", "Sum of the last request's input",
                pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily(
                "custom_metrics_input_value", "Input values seen",
                pb_utils.MetricFamily.HISTOGRAM),
        )
        # Labels given out of order: /metrics prints them sorted by name.
        labels = {"zone": "z1", "app": "demo"}
        self.requests = requests.Metric(labels=labels)
        self.last_sum = last_sum.Metric(labels=labels)
        self.values = values.Metric(labels=labels, buckets=BUCKETS)

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.requests.increment(1)
            self.last_sum.set(float(data.sum()))
            for value in data.flat:
                self.values.observe(float(value))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
