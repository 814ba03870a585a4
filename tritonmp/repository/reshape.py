"""`reshape` of a model's inputs and outputs, as Triton applies it: a client sends and receives the
shapes its config's `dims` give, and the model sees and makes the shapes `reshape.shape` gives. The
bytes stay as they are; only shapes change, at the wire to the worker. The variable dimensions (-1)
of one side take the sizes of the other side's variable dimensions, in order; the batch dimension,
where the model batches, goes through untouched."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc


def _mapping(tensors) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    return {t.name: (tuple(t.dims), tuple(t.reshape.shape)) for t in tensors if t.HasField("reshape")}


def _convert(shape: list[int], source: tuple[int, ...], target: tuple[int, ...], skip: int) -> list[int]:
    """`shape` (of `source`'s form past its first `skip` dimensions) in `target`'s form."""
    rest = shape[skip:]
    if len(rest) != len(source):  # not of the configured form: left for the model or its check to refuse
        return shape
    variable = iter(d for d, s in zip(rest, source) if s == -1)
    return [*shape[:skip], *(next(variable, 1) if t == -1 else t for t in target)]


class Reshapes:
    """The reshapes of one model version: None from `of` when it has none."""

    __slots__ = ("inputs", "outputs", "skip")

    def __init__(self, config: mc.ModelConfig):
        self.inputs = _mapping(config.input)
        self.outputs = _mapping(config.output)
        self.skip = 1 if config.max_batch_size > 0 else 0  # the batch dimension goes through

    @classmethod
    def of(cls, config: mc.ModelConfig) -> Reshapes | None:
        reshapes = cls(config)
        return reshapes if reshapes.inputs or reshapes.outputs else None

    def to_model(self, name: str, shape: list[int]) -> list[int]:
        """An input's shape as the model sees it."""
        pair = self.inputs.get(name)
        return shape if pair is None else _convert(shape, pair[0], pair[1], self.skip)

    def to_client(self, name: str, shape: list[int]) -> list[int]:
        """An output's shape as the client receives it."""
        pair = self.outputs.get(name)
        return shape if pair is None else _convert(shape, pair[1], pair[0], self.skip)

    def refs_to_model(self, refs) -> None:
        """The inputs of a request on its way to the worker (transport.TensorRef), in the model's shapes."""
        for ref in refs:
            if ref.name in self.inputs:
                ref.shape = self.to_model(ref.name, ref.shape)

    def refs_to_client(self, refs) -> None:
        """The outputs of a response from the worker (transport.TensorRef), in the client's shapes."""
        for ref in refs:
            if ref.name in self.outputs:
                ref.shape = self.to_client(ref.name, ref.shape)


def problems(t, kind: str, max_batch_size: int) -> list[str]:
    """What is wrong with a tensor's reshape, in Triton's words (empty: nothing, or no reshape)."""
    if not t.HasField("reshape"):
        return []
    prefix = f"model {kind} '{t.name}' "
    shape = list(t.reshape.shape)
    if not shape and max_batch_size == 0:
        return [prefix + "cannot have empty reshape for non-batching model as scalar tensors are not supported"]
    if any(d < 1 and d != -1 for d in shape):
        return [prefix + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"]
    dims = list(t.dims)

    def runs(values: list[int]) -> list[int]:  # element counts between the variable dimensions
        counts, current = [], 1
        for d in values:
            if d == -1:
                counts.append(current)
                current = 1
            else:
                current *= d
        return [*counts, current]

    dim_runs, shape_runs = runs(dims), runs(shape)
    if -1 not in dims and -1 not in shape:
        if dim_runs != shape_runs and not (not shape and dim_runs == [1]):
            return [prefix + "has different size for dims and reshape"]
        return []
    if (-1 in dims) != (-1 in shape):
        return [prefix + "has different size for dims and reshape"]
    if len(dim_runs) != len(shape_runs):
        return [prefix + "has different number of variable-size dimensions for dims and reshape"]
    if dim_runs != shape_runs:
        return [prefix + "has different size for dims and reshape"]
    return []
