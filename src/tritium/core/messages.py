"""Error texts that Triton's clients and tests match on, worded as Triton words them.

One table, so that a frontend, the core and the python backend that report the same failure
say it the same way; each entry names the Triton source it follows. Templates take their
arguments by name (``str.format``).
"""

from __future__ import annotations

# -- custom metrics (python_backend src/metric.cc, metric_family.cc; core src/metric_family.cc;
# prometheus-cpp's registry and family checks). The stub prefixes the server's reason with the
# operation that failed.
METRIC_CREATE_FAMILY = "Error when creating MetricFamily: {reason}"
METRIC_CREATE = "Error when creating Metric: {reason}"
METRIC_INCREMENT = "Failed to increment metric value: {reason}"
METRIC_SET = "Failed to set metric value: {reason}"
METRIC_OBSERVE = "Failed to observe metric value: {reason}"
METRIC_VALUE = "Failed to get metric value: {reason}"
METRIC_UNSUPPORTED = "TRITONSERVER_METRIC_KIND_{kind} does not support {operation}"
METRIC_NEGATIVE_INCREMENT = ("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                             "monotonically by non-negative values.")
METRIC_FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
    "been deleted.")
METRIC_OTHER_KIND = "Family name already exists with different type"
METRIC_INVALID_NAME = "Invalid metric name"
METRIC_INVALID_LABEL = "Invalid label name"
METRIC_LABEL_VALUE = "label {name!r} must have a string value"
METRIC_UNSORTED_BUCKETS = "Bucket Boundaries must be strictly sorted"
METRIC_LABELS_NOT_DICT = "Failed to create metric. Labels must be a dictionary."
METRIC_BUCKETS_NOT_LIST = "Failed to create metric. Buckets must be a list."
METRIC_UNEXPECTED_BUCKETS = "Failed to create metric. Unexpected buckets found."
METRIC_MISSING_BUCKETS = "Failed to create metric. Missing required buckets."

# -- one request, one response (server src/http_server.cc: InferResponseComplete counts the
# responses of /infer; GenerateRequestClass::SendChunkResponse refuses a non-streaming
# generate that did not produce exactly one). Neither carries the request id.
INFER_ONE_RESPONSE = "expected a single response, got {count}"
GENERATE_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate "
                         "stream for model that generates various number of responses")

# -- request checks (core src/infer_request.cc ValidateRequestInputs), after the
# "[request id: <id>] " prefix every core request check carries.
EXPECTED_INPUTS = "expected {count} inputs"
EXPECTED_INPUTS_BETWEEN = "expected number of inputs between {low} and {high}"
MISSING_INPUTS = ("{expected} but got {count} inputs for model '{model}'. Got input(s) {given}, "
                  "but missing required input(s) {missing}. Please provide all required "
                  "input(s).")

# -- python backend (python_backend src/pb_stub.cc). The stub is named after the model
# instance ("<model>_<group>_<index>"), so these name the instance, not the model.
PY_EXECUTE_FAILED = "Failed to process the request(s) for model '{instance}', message: {reason}"
PY_DECOUPLED_RETURN = ("Python model '{instance}' is using the decoupled mode and the execute "
                       "function must return None.")
# Triton's spelling ("reschduled").
PY_RESCHEDULED_RESPONSE = ("Expected a None object in the execute function return list for "
                           "reschduled request, found type '{type}'.")
# -- request release (core src/infer_request.cc): a model rescheduled a request its model's
# scheduler cannot take back (no iterative sequence batching, or the sequence's END).
RESCHEDULE_NOT_CONFIGURED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                             "while the model is not configured to handle such a flag.")

# -- BLS (python_backend src/request_executor.cc RequestExecutor::Infer): whatever the server
# refuses while a request is submitted is reported with the model's name and this prefix.
BLS_SUBMIT_FAILED = "Model {model} - Error when running inference: {reason}"
# Worded (and quoted) as Triton words it, stray quote included.
BLS_DECOUPLED_ON_EXEC = (
    "Model {model} is using the decoupled. The current BLS request call doesn't support "
    "models using the decoupled transaction policy. Please use 'decoupled=True' argument to "
    "the 'exec' or 'async_exec' calls for decoupled models.'")

# -- parameters and JSON fields of the wrong type. HTTP (server src/http_server.cc): the
# field's name, then TritonJson's own refusal (common include/triton/common/triton_json.h).
JSON_NOT_UNSIGNED = ("Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
                     "unsigned-integer")
JSON_NOT_BOOL = "Unable to parse '{key}': attempt to access JSON non-boolean as boolean"
JSON_NOT_STRING = "Unable to parse '{key}': attempt to access JSON non-string as string"
# Output options are "set", not "parsed" (CheckClassificationOutput, ValidateOutputParameter).
JSON_SET_NOT_UNSIGNED = ("Unable to set '{key}': attempt to access JSON non-unsigned-integer as "
                         "unsigned-integer")
JSON_SET_NOT_BOOL = "Unable to set '{key}': attempt to access JSON non-boolean as boolean"
JSON_MISSING = "Unable to parse '{key}': attempt to access non-existing object member '{key}'"
JSON_NOT_ARRAY = "Unable to parse '{key}': attempt to access JSON non-array as array"
# ReadDataFromJson (http_server.cc) on a datatype name it does not know.
JSON_INVALID_DATATYPE = "invalid datatype for input {name}"
# ParseJsonTritonParams: "parameters" must be an object; a model parameter a JSON scalar (it
# takes floats too, though its text does not say so).
JSON_PARAMETERS_NOT_OBJECT = ("failed to get request params.: attempt to get members for "
                              "non-object")
JSON_PARAMETER_TYPE = ("parameter '{key}' has invalid type. It should be either 'int', 'bool', "
                       "or 'string'.")
# gRPC (server src/grpc/infer_handler.cc, grpc_utils.cc): the InferParameter fields expected.
PROTO_WRONG_TYPE = "invalid value type for '{key}' parameter, expected {expected}."
PROTO_NOT_BOOL = "invalid value type for '{key}' parameter, expected bool_param."
PROTO_NEGATIVE = "invalid value for '{key}', expected value >= 0."
# A model parameter of another kind (uint64_param, or none set), and the reserved prefix:
# HTTP refuses every such key, gRPC names the one it allows.
PROTO_MODEL_PARAMETER_TYPE = ("invalid value type for '{key}' parameter, expected int64_param, "
                              "bool_param, or string_param.")
RESERVED_PREFIX_HTTP = ("parameter keys starting with 'triton_' are reserved for Triton usage "
                        "and should not be specified.")
RESERVED_PREFIX_GRPC = ("parameter keys starting with 'triton_' are reserved for Triton usage. "
                        "Only the following keys starting with 'triton_' are allowed: {allowed}")

# -- pb_utils arguments Triton's own code checks (python_backend src/pb_stub.cc, pb_tensor.cc);
# wrong C++ argument types are pybind11's TypeError (backends/python/arguments.py).
PB_CORRELATION_ID = "Correlation ID must be integer or string"
PB_CAST_FAILED = ("Unable to cast Python instance to C++ type (#define "
                  "PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)")
# typeid(py::dict).name() as GCC writes it.
PB_NOT_DICT = "Expect N8pybind114dictE, got {type}"
PB_PARAMETER_KEY = "Expect parameters keys to have type str, found type {type}"
PB_PARAMETER_VALUE = "Expect parameters values to have type bool/int/str, found type {type}"
PB_EMPTY_TENSOR_NAME = "Tensor name cannot be an empty string."
PB_EMPTY_REQUEST_INPUT = ("Input tensor for request with id '{request_id}' and model name "
                          "'{model_name}' should not be empty.")
PB_EMPTY_REQUESTED_OUTPUT = ("Requested output name for request with id '{request_id}' and "
                             "model name '{model_name}' should not be empty.")
PB_EMPTY_RESPONSE_OUTPUT = "Output tensor for inference response should not be empty."
# The C++ literal continues its line with a backslash, so the next line's indent is kept.
PB_NOT_DLPACK = ("Provided tensor is not supported. Tensor must be a DLPack capsule "
                 "        or have `__dlpack__` and `__dlpack_device__` attributes")
# tritium's own: it has no GPU tensors, so a DLPack import must be readable by the CPU.
PB_DLPACK_NOT_CPU = ("DLPack tensor cannot be imported: tritium keeps tensors in CPU memory "
                     "(copy GPU data to the CPU first, e.g. torch's .cpu()): {reason}")
PB_BF16_AS_NUMPY = ("Tensor dtype is BF16 and cannot be converted to NumPy. Use "
                    "to_dlpack() and from_dlpack() instead.")

# -- system shared memory (server src/shared_memory_manager.cc, common.cc/.h, http_server.cc,
# grpc/grpc_utils.h, grpc/infer_handler.cc). Registration and lookup first, then the tensor
# parameters each frontend parses.
SHM_DISABLED = ("Client shared memory is disabled. Start the server with "
                "'--allow-client-shm=true' to enable.")
SHM_NEEDS_NAME = "'region name' is necessary to register system shared memory region"
SHM_NO_FIELD = "Shared memory register request has no '{field}' field"
SHM_INVALID_KEY = "cannot register shared memory region '{name}' - invalid shm key '{key}'"
SHM_RESERVED_KEY = ("cannot register shared memory region '{name}' with key '{key}' as the "
                    "key contains the reserved prefix '{prefix}'")
SHM_ALREADY_REGISTERED = "shared memory region '{name}' already in manager"
SHM_CANNOT_OPEN = "Unable to open shared memory region: '{key}'"
SHM_NOT_A_REGION = "Invalid shared memory region: '{key}'"
SHM_OUT_OF_BOUNDS = "failed to register shared memory region '{name}': invalid args"
# mmap's refusal of an empty mapping, as Triton words it (strerror joined without a space).
SHM_EMPTY = ("failed to register shared memory region '{name}': unable to process address "
             "spaceInvalid argument")
SHM_TOO_MANY = ("failed to register shared memory region '{name}': {limit} regions are "
                "registered already, the most this server holds")
SHM_KEY_NOT_ALLOWED = ("cannot register shared memory region '{name}': key '{key}' does not "
                       "start with '{prefix}', the prefix this server allows")
SHM_NOT_OURS = ("cannot register shared memory region '{name}': '{key}' belongs to another "
                "user, or other users may write it")
SHM_BUSY = ("shared memory: {held} bytes read out of regions are held by requests in flight, "
            "and {size} more would pass the most allowed ({limit}); try again later")
SHM_UNKNOWN_REGION = "Unable to find shared memory region: '{name}'"
SHM_UNKNOWN_STATUS = "Unable to find system shared memory region: '{name}'"
SHM_BAD_OFFSET = "Invalid offset for shared memory region: '{name}'"
SHM_BAD_RANGE = "Invalid offset + byte size for shared memory region: '{name}'"
# tritium's own: Triton would fault (SIGBUS) on a region whose file shrank under it.
SHM_SHRUNK = ("shared memory region '{name}' is smaller than when it was registered: its "
              "file holds {size} bytes, {needed} are needed")
SHM_READ_TOO_BIG = ("a tensor of {size} bytes can not be read from shared memory region "
                    "'{name}': at most {limit} bytes are")
SHM_READ_ONLY = "shared memory region '{name}' can not be written: its file is read-only"
SHM_OUTPUT_TOO_SMALL = ("shared memory size specified with the request for output '{output}' "
                        "({size} bytes) should be at least {needed} bytes to hold the results")
SHM_HTTP_WITH_CLASSIFICATION = ("Output can't set both 'shared_memory_region' and "
                                "'classification'")
SHM_HTTP_WITH_BINARY = "Output can't set both 'shared_memory_region' and 'binary_data'"
SHM_GRPC_WITH_CLASSIFICATION = ("output can't set both 'shared_memory_region' and "
                                "'classification'")
SHM_GRPC_WRONG_TYPE = ("invalid value type for '{key}' parameter for tensor '{tensor}', "
                       "expected {expected}.")
SHM_GRPC_WITHOUT_REGION = ("'{key}' can not be specified without 'shared_memory_region' "
                           "parameter for tensor '{tensor}'")
SHM_GRPC_WITH_CONTENTS = ("unexpected 'content' provided when using shared memory for input "
                          "tensor '{tensor}' for model '{model}'")
# Triton built without CUDA (http_server.cc, grpc_server.cc): CUDA regions can not be
# registered; status lists none and unregistering finds nothing to do.
CUDA_SHM_UNSUPPORTED = ("failed to register CUDA shared memory region: '{name}', GPUs not "
                        "supported")
CUDA_SHM_NEEDS_NAME = "'region name' is necessary to register cuda shared memory region"
CUDA_SHM_UNKNOWN_STATUS = "Unable to find cuda shared memory region: '{name}'"
CUDA_SHM_IS_SYSTEM = ("The region named '{name}' is registered as system shared memory, not "
                      "CUDA shared memory")
