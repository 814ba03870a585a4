"""Triton's checks of the parameters an infer request carries for the server itself (priority,
timeout, sequence flags, binary data, classification, shared memory), as each protocol makes them
and in its words: gRPC looks at which field of an InferParameter is set, HTTP at the JSON type of
each value. Parameters a model reads are passed on, once their type is one Triton takes."""

from __future__ import annotations

from ..errors import invalid

RESERVED_GRPC = "triton_enable_empty_final_response"  # the one request parameter of Triton's own gRPC takes

# -- gRPC: InferParameter messages ---------------------------------------------------------------

def check_grpc_request(parameters) -> None:
    """A ModelInferRequest's `parameters` map: Triton's own keys with the field they need set, any
    other with a value a model can be given (int64, bool, string or double)."""
    for key, param in parameters.items():
        which = param.WhichOneof("parameter_choice")
        if key == "sequence_id":
            if which not in ("int64_param", "string_param"):
                raise invalid("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
        elif key in ("sequence_start", "sequence_end"):
            if which != "bool_param":
                raise invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif key == "priority":
            if which == "int64_param":
                if param.int64_param < 0:
                    raise invalid("invalid value for 'priority', expected value >= 0.")
            elif which != "uint64_param":
                raise invalid("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
        elif key == "timeout":
            if which != "int64_param":
                raise invalid("invalid value type for 'timeout' parameter, expected int64_param.")
        elif key.startswith("triton_"):
            if key != RESERVED_GRPC:
                raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                              f"following keys starting with 'triton_' are allowed: {RESERVED_GRPC}")
            if which != "bool_param":
                raise invalid(f"invalid value type for '{RESERVED_GRPC}' parameter, expected bool_param.")
        elif which not in ("int64_param", "bool_param", "string_param", "double_param"):
            raise invalid(f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or "
                          "string_param.")


def check_grpc_shared_memory(tensor) -> bool:
    """The shared_memory_* parameters of an input or requested output, as Triton reads them;
    whether the tensor uses shared memory."""
    params = tensor.parameters
    region = params.get("shared_memory_region")
    if region is not None and region.WhichOneof("parameter_choice") != "string_param":
        raise invalid(f"invalid value type for 'shared_memory_region' parameter for tensor '{tensor.name}', "
                      "expected string_param.")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        value = params.get(key)
        if value is None:
            continue
        if region is None:
            raise invalid(f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor "
                          f"'{tensor.name}'")
        if value.WhichOneof("parameter_choice") != "int64_param":
            raise invalid(f"invalid value type for '{key}' parameter for tensor '{tensor.name}', expected "
                          "int64_param.")
    if region is not None and "shared_memory_byte_size" not in params:
        raise invalid(f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
                      f"for tensor '{tensor.name}'")
    return region is not None


def check_grpc_output(output) -> None:
    """A requested output's parameters: shared memory, and a classification count (an int64 above 0),
    not both."""
    shm = check_grpc_shared_memory(output)
    count = output.parameters.get("classification")
    if count is None:
        return
    if count.WhichOneof("parameter_choice") != "int64_param":
        raise invalid("invalid value type for 'classification' parameter, expected int64_param")
    if count.int64_param <= 0:
        raise invalid("invalid value for 'classification' parameter, expected >= 0")
    if shm:
        raise invalid("output can't set both 'shared_memory_region' and 'classification'")


# -- HTTP: JSON values -----------------------------------------------------------------------------

def wrong_json_type(wanted: str, prefix: str = "") -> Exception:
    """Triton's words for a JSON value that is not of the type it reads (`wanted`: "string",
    "boolean", "unsigned-integer"), after `prefix` ("Unable to parse 'key': ")."""
    return invalid(f"{prefix}attempt to access JSON non-{wanted} as {wanted}")


def _unparsable(key: str, wanted: str) -> Exception:
    return wrong_json_type(wanted, f"Unable to parse '{key}': ")


def unsigned(value) -> bool:
    """Whether a JSON value is one Triton reads as an unsigned integer."""
    return type(value) is int and value >= 0


_JSON_REQUEST = {  # Triton's own request parameters: what each must be, and the word for it
    "priority": (unsigned, "unsigned-integer"), "timeout": (unsigned, "unsigned-integer"),
    "sequence_start": (lambda v: type(v) is bool, "boolean"), "sequence_end": (lambda v: type(v) is bool, "boolean"),
    "binary_data_output": (lambda v: type(v) is bool, "boolean"),
    "sequence_id": (lambda v: unsigned(v) or type(v) is str, "string"),
}
_MODEL_VALUE = (int, bool, str, float)  # what a parameter a model reads may be


def check_json_request(parameters: dict) -> None:
    """An HTTP infer request's `parameters` object."""
    for key, value in parameters.items():
        rule = _JSON_REQUEST.get(key)
        if rule is not None:
            if not rule[0](value):
                raise _unparsable(key, rule[1])
        elif key.startswith("triton_"):
            raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                          "specified.")
        elif type(value) not in _MODEL_VALUE:
            raise invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def check_json_shared_memory(params: dict) -> None:
    """The shared_memory_* parameters of an input or requested output of an HTTP request."""
    region = params.get("shared_memory_region")
    if region is not None and type(region) is not str:
        raise _unparsable("shared_memory_region", "string")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in params and not unsigned(params[key]):
            raise _unparsable(key, "unsigned-integer")


def check_json_output(params: dict) -> None:
    """A requested output's parameters in an HTTP request: binary_data a boolean, classification an
    unsigned integer (0: none), not with shared memory."""
    if "binary_data" in params and type(params["binary_data"]) is not bool:
        raise _unparsable("binary_data", "boolean")
    if "shared_memory_region" in params or "shared_memory_offset" in params or "shared_memory_byte_size" in params:
        check_json_shared_memory(params)
    count = params.get("classification")
    if count is None:
        return
    if not unsigned(count):
        raise wrong_json_type("unsigned-integer", "Unable to set 'classification': ")
    if count and "shared_memory_region" in params:
        raise invalid("Output can't set both 'shared_memory_region' and 'classification'")
