"""PyTorch FX import: the seed's model, a CNN and an MLP, every functional/method form the
importer claims, and its refusals.

Tolerances: the imported graph runs by the reference denotation in float64 and is compared with
the same PyTorch model converted to float64, so both compute the same formulas in the same
precision; only summation order and libm differ: rtol 1e-10, atol 1e-12.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "models"))

import seed_fx  # noqa: E402
import torch_models  # noqa: E402

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.dialect.printer import print_listing  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402

SEED_LISTING = """\
0: input parents=[] out=[4]
1: linear(payload=node_id) parents=[0] out=[5]
2: relu parents=[1] out=[5]
3: linear(payload=node_id) parents=[2] out=[3]
4: sum parents=[3] out=[]
5: tanh parents=[4] out=[]"""

X0 = [0.3, -0.2, 0.1, 0.4]


def check_against_torch(model: nn.Module, *examples: torch.Tensor) -> tlc.semantics.program.Traced:
    traced = tlc.from_torch(model, examples if len(examples) > 1 else examples[0])
    inputs = [e.double().numpy() for e in examples]
    ours = interpret(traced.graph, traced.payload, inputs if len(inputs) > 1 else inputs[0])
    with torch.no_grad():
        expected = model.double()(*(e.double() for e in examples)).numpy()
    assert ours.output.shape == expected.shape
    np.testing.assert_allclose(ours.output, expected, rtol=1e-10, atol=1e-12)
    return traced


def test_seed_model_imports_to_the_six_node_listing() -> None:
    traced = tlc.from_torch(seed_fx.make(), torch.tensor(X0))
    assert print_listing(traced.graph) == SEED_LISTING
    assert sorted(traced.payload) == [1, 3]
    assert traced.payload[1]["weight"].shape == (5, 4)  # PyTorch's [out, in]
    assert f"{float(interpret(traced.graph, traced.payload, X0).output):.6f}" == "0.027713"


def test_seed_model_compiles_with_llvm() -> None:
    traced = tlc.from_torch(seed_fx.make(), torch.tensor(X0))
    compiled = tlc.compile(traced.module, traced.payload)
    assert f"{float(compiled(np.array(X0))):.6f}" == "0.027713"


def test_cnn_matches_pytorch() -> None:
    traced = check_against_torch(torch_models.cnn(), torch.randn(2, 3, 8, 8))
    tags = [n.TAG for n in traced.graph.nodes]
    assert tags[:5] == ["input", "conv", "batch_norm_eval", "relu", "max_pool"]
    assert traced.graph.nodes[1].meta("channel_axis") == 1  # the batch dim stays


def test_mlp_matches_pytorch() -> None:
    check_against_torch(torch_models.mlp(), torch.randn(3, 8))


class Functional(nn.Module):
    """Functional and method forms, broadcasting against scalars and parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))
        self.v = nn.Parameter(torch.randn(6, 4))
        self.b = nn.Parameter(torch.randn(4))
        self.k = nn.Parameter(torch.randn(3, 2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [2, 2, 6]
        y = F.conv1d(x, self.k, padding=1)  # [2, 3, 6]
        y = F.max_pool1d(F.relu(y), 2)  # [2, 3, 3]
        y = torch.cat([y, y.sigmoid()], dim=-1).transpose(1, 2)  # [2, 6, 3]
        z = x.permute(0, 2, 1).reshape(2, 6, 2).sum(dim=2, keepdim=True)  # [2, 6, 1]
        y = (y - z) * 0.5  # [2, 6, 3]
        h = torch.matmul(y.transpose(1, 2), self.w) + self.b  # [2, 3, 4]
        h = F.linear(F.softplus(-h).mean(1), self.v, bias=None)  # [2, 6]
        return F.log_softmax(torch.tanh(h).view(h.size(0), -1), dim=1).flatten()


class Sizes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), x.shape[1] * x.size(2)).abs().sqrt().exp()


def test_functional_and_method_forms_match_pytorch() -> None:
    torch.manual_seed(3)
    traced = check_against_torch(Functional(), torch.randn(2, 2, 6))
    assert "broadcast_to" in [n.TAG for n in traced.graph.nodes]


def test_max_pool_ceil_mode_pads_with_minus_infinity() -> None:
    model = nn.Sequential(nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True))
    traced = check_against_torch(model, torch.randn(1, 2, 6, 7))
    assert [n.TAG for n in traced.graph.nodes][-1] == "max_pool"
    assert "concat" in [n.TAG for n in traced.graph.nodes]


def test_static_sizes_are_folded() -> None:
    traced = check_against_torch(Sizes(), torch.randn(2, 3, 4))
    assert [n.TAG for n in traced.graph.nodes] == ["input", "reshape", "abs", "sqrt", "exp"]


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x, y) - torch.minimum(x, y) * y


def test_several_inputs_become_several_input_nodes() -> None:
    traced = check_against_torch(TwoInputs(), torch.randn(3), torch.randn(3))
    assert [n.TAG for n in traced.graph.nodes[:2]] == ["input", "input"]


class Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.mish(x)


class Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.relu(), x.tanh()


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keep", torch.tensor([True, False, True, False]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.keep]


class Branch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() if x.sum() > 0 else x


def _refusal(model: nn.Module, *examples: torch.Tensor) -> str:
    with pytest.raises(DiagnosticError) as info:
        tlc.from_torch(model, examples if len(examples) > 1 else examples[0])
    return str(info.value)


def test_refusals_name_the_node_and_target() -> None:
    x = torch.randn(2, 4)
    assert _refusal(Mish(), x) == (
        "PyTorch graph import: unsupported target torch.nn.functional.mish "
        "(FX node 'mish', call_function)"
    )
    assert _refusal(Pair(), x) == (
        "PyTorch graph import: the model returns 2 values; tl graphs have one output"
    )
    assert _refusal(Masked(), x) == (
        "PyTorch graph import: FX node 'getitem': its shape or value depends on the tensor "
        "values (the graph would hold only the example's)"
    )
    assert _refusal(Branch(), x) == (
        "PyTorch graph import: torch.fx cannot trace Branch: Python control flow on the tensor "
        "values of 'gt' (the graph would hold only the example's branch)"
    )
    assert _refusal(nn.Sequential(nn.BatchNorm1d(4)), x) == (
        "PyTorch graph import: FX node '_0' (torch.nn.modules.batchnorm.BatchNorm1d): "
        "batch norm in training mode (call .eval() first)"
    )
    assert _refusal(nn.Sequential(nn.Softplus(beta=2)), x) == (
        "PyTorch graph import: FX node '_0' (torch.nn.modules.activation.Softplus): "
        "softplus with beta=2, threshold=20.0 (only 1, 20)"
    )
    assert _refusal(TwoInputs(), x) == (
        "PyTorch graph import: the model takes 2 inputs (x, y), 1 example inputs given"
    )


class Leaky(nn.Module):
    """Every PyTorch form of leaky_relu: positional and keyword slope, module, default."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.LeakyReLU(0.3)
        self.default = nn.LeakyReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.leaky_relu(x, 0.2) - F.leaky_relu(x, negative_slope=-0.5)
        return self.default(self.act(y) * F.leaky_relu(x) + F.gelu(x, approximate="tanh"))


def test_leaky_relu_forms_match_pytorch() -> None:
    """The slope comes from the argument after the tensor (by position or keyword), from the
    module's `negative_slope`, or is the default 0.01; values agree with PyTorch in float64
    (leaky_relu is one product and a selection: exact, up to the gelu in the mix)."""
    x = torch.randn(4, 5, dtype=torch.float64)
    x[0, 0] = 0.0
    traced = check_against_torch(Leaky(), x)
    slopes = [n.meta("negative_slope") for n in traced.graph.nodes if n.TAG == "leaky_relu"]
    assert slopes == [0.2, -0.5, 0.3, 0.01, 0.01]
    assert [n.meta("approximate") for n in traced.graph.nodes if n.TAG == "gelu"] == ["tanh"]
    alone = tlc.from_torch(nn.Sequential(nn.LeakyReLU(0.2)), x)
    ours = interpret(alone.graph, alone.payload, x.numpy()).output
    np.testing.assert_allclose(ours, F.leaky_relu(x, 0.2).numpy(), rtol=0, atol=1e-12)


def _masked(x: torch.Tensor) -> torch.Tensor:
    """masked_fill by a computed mask and by one built in place on `new_zeros` (as swin's
    attention mask is), which the trace holds as a constant."""
    mask = x.new_zeros((3, 5))
    mask[0, 1:3] = 1
    return x.masked_fill(x > 0, 1.0) + torch.masked_fill(x, mask != 0, -2.0)


def _zeroed_bias(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """A copy of a parameter changed in place (as swin v2's qkv bias is): a constant."""
    bias = layer.bias.clone()
    bias[1:3].zero_()
    return F.linear(x, layer.weight, bias)


class Applied(nn.Module):
    """A model that is one function of its input and submodules (the forms of an op kind)."""

    def __init__(self, function: Any, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        self.function = function
        self.layers = nn.ModuleDict(modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x, self.layers)


#: Each op kind's PyTorch forms (functions, methods, modules, operators), with the tags the import
#: must produce; values are compared with PyTorch in float64.
FORMS: dict[str, tuple[Any, dict[str, nn.Module], list[str]]] = {
    "neg": (lambda x, m: -x + torch.neg(x) * x.neg(), {}, ["neg"] * 3),
    "pow_tensor_exponents": (
        lambda x, m: torch.pow(x.abs(), x * 0.3) + 2.0**x + x.abs().pow(x * 0.1) + x**2,
        {},
        ["pow_elem"] * 3 + ["pow"],
    ),
    "erf": (lambda x, m: torch.erf(x) + x.erf() + torch.special.erf(x), {}, ["erf"] * 3),
    "elu": (
        lambda x, m: F.elu(x) + F.elu(x, 0.5) * F.elu(x, alpha=2.0) + m["elu"](x),
        {"elu": nn.ELU(0.3)},
        ["elu"] * 4,
    ),
    "selu": (
        lambda x, m: F.selu(x) + torch.selu(x) + m["selu"](x),
        {"selu": nn.SELU()},
        ["selu"] * 3,
    ),
    "hardsigmoid": (
        lambda x, m: F.hardsigmoid(x) + m["h"](x),
        {"h": nn.Hardsigmoid()},
        ["hardsigmoid"] * 2,
    ),
    "hardswish": (
        lambda x, m: F.hardswish(x) + m["h"](x),
        {"h": nn.Hardswish()},
        ["hardswish"] * 2,
    ),
    "silu": (lambda x, m: F.silu(x) + m["silu"](x), {"silu": nn.SiLU()}, ["silu"] * 2),
    "clip": (
        lambda x, m: (
            torch.clamp(x, -1, 2)
            + x.clamp(min=0.5) * torch.clip(x, None, 1.5)
            + F.hardtanh(x)
            + F.relu6(x)
            + m["h"](x)
            + m["r"](x)
        ),
        {"h": nn.Hardtanh(-2.0, 0.5), "r": nn.ReLU6()},
        ["clip"] * 7,
    ),
    "div": (
        lambda x, m: x / 2.0 + torch.div(x, x + 10) * x.div(3.0) + torch.true_divide(1.0, x + 10),
        {},
        ["div"] * 4,
    ),
    "pow": (
        lambda x, m: x**2 + torch.pow(x, 3) * x.pow(exponent=0.5 * 2) + (x * x + 1) ** -0.75,
        {},
        ["pow"] * 4,
    ),
    "swapaxes": (
        lambda x, m: (
            torch.swapaxes(x, 0, 1).swapdims(1, 0) + torch.swapdims(x, -1, 0).swapaxes(0, 1)
        ),
        {},
        ["transpose"] * 4,
    ),  # fmt: skip
    "roll": (
        lambda x, m: torch.roll(x, 1, 0) + x.roll((2, -6), (0, 1)) * torch.roll(x, shifts=4),
        {},
        ["gather"] * 4,
    ),
    "normalize": (
        lambda x, m: F.normalize(x, dim=-1) + F.normalize(x * 1e-13, dim=0, eps=1e-12),
        {},
        ["div"] * 2,
    ),
    "clone_of_a_parameter": (
        lambda x, m: _zeroed_bias(x, m["l"]),
        {"l": nn.Linear(5, 4)},
        ["linear"],
    ),
    "masked_fill": (lambda x, m: _masked(x) + F.dropout(x, 0.3, training=False), {}, ["where"] * 2),
    "rsqrt": (lambda x, m: torch.rsqrt(x * x + 1) + (x * x + 2).rsqrt(), {}, ["rsqrt"] * 2),
    "less_and_where": (
        lambda x, m: (
            torch.where(x < 0.5, x, -x)
            + (x > 1) * torch.where(torch.lt(x, 2), 2.0, x)
            + x.lt(0)
            + torch.gt(x, -1) * x.gt(0)
        ),
        {},
        ["less", "where", "less", "less", "where", "less", "less", "less"],
    ),
}

#: Forms of the op kinds that want an [N, C, H, W] input (compared alike, in float64).
NCHW_FORMS: dict[str, tuple[Any, dict[str, nn.Module], list[str]]] = {
    "pad": (
        lambda x, m: (
            F.pad(x, (1, 2, 1, 1), value=0.5)
            + F.pad(x, (2, 1, 0, 2), mode="reflect")
            + F.pad(x, (0, 3, 2, 0), mode="replicate")
            + m["r"](x) + m["z"](x) + m["m"](x) + m["c"](x)
        ),
        {"r": nn.ReplicationPad2d((1, 2, 1, 1)), "z": nn.ZeroPad2d((3, 0, 1, 1)),
         "m": nn.ReflectionPad2d((1, 2, 2, 0)), "c": nn.ConstantPad2d((1, 2, 0, 2), -1.0)},
        ["pad"] * 7,
    ),
    "pad_circular_and_crop": (
        lambda x, m: (
            F.pad(x, (2, 3, 1, -1), mode="circular")
            + m["c"](x)
            + F.pad(x, (-1, 6, 1, -1))
            + F.pad(x, (-2, 7, 0, 0), mode="replicate")
        ),
        {"c": nn.CircularPad2d((1, 4, 2, -2))},
        # circular: crop H, wrap W, wrap H (twice); constant: crop W, H, pad; replicate: crop, pad
        ["gather"] * 8 + ["pad", "gather", "pad"],
    ),
    "prelu": (
        lambda x, m: (
            m["one"](x) + m["per_channel"](x)
            + F.prelu(x, torch.full((1,), 0.3, dtype=torch.float64))
        ),
        {"one": nn.PReLU(), "per_channel": nn.PReLU(4, init=-0.2)},
        ["prelu"] * 3,
    ),
    "lrn": (
        lambda x, m: m["lrn"](x) + F.local_response_norm(x, 3, alpha=0.5, beta=0.6, k=2.0),
        {"lrn": nn.LocalResponseNorm(5)},
        ["lrn"] * 2,
    ),
    "conv_transpose": (
        lambda x, m: m["t"](x) + m["g"](x),
        {"t": nn.ConvTranspose2d(4, 6, 3, stride=(3, 2), padding=1, output_padding=(1, 0)),
         "g": nn.ConvTranspose2d(4, 6, 2, stride=(3, 2), padding=1, output_padding=(1, 0),
                                 groups=2, dilation=2)},
        ["conv"] * 2,
    ),
    "avg_pool_partial_windows_and_uncounted_padding": (
        lambda x, m: m["ceil"](x)[..., :3]
        + F.avg_pool2d(x, (3, 2), stride=2, padding=1, count_include_pad=False)[..., :3]
        + F.avg_pool2d(x, 3, stride=(2, 3), padding=1, ceil_mode=True,
                       count_include_pad=False),
        {"ceil": nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)},
        ["avg_pool"] * 3,
    ),
    "max_pool_dilation_not_dividing_stride": (
        lambda x, m: F.max_pool2d(x, 3, stride=(1, 2), padding=1, dilation=(2, 3),
                                  ceil_mode=True),
        {}, ["max_elem"] * 4,
    ),
    "max_pool_dilation_dividing_stride": (
        lambda x, m: m["p"](x), {"p": nn.MaxPool2d(2, stride=2, dilation=2, padding=1)},
        ["max_pool"] * 2,
    ),
    "conv_transpose_padding_beyond_the_kernel_span": (
        lambda x, m: m["t"](x),
        {"t": nn.ConvTranspose2d(4, 6, 3, stride=(2, 1), padding=(3, 3))},
        ["conv"],
    ),
    "group_and_instance_norm": (
        lambda x, m: m["g"](x) + m["i"](x) + F.group_norm(x, 2) + F.instance_norm(x),
        {"g": nn.GroupNorm(2, 4), "i": nn.InstanceNorm2d(4, affine=True)},
        ["layernorm"] * 4,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(NCHW_FORMS))
def test_nchw_op_forms_match_pytorch(name: str) -> None:
    function, modules, tags = NCHW_FORMS[name]
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    traced = check_against_torch(Applied(function, modules).double(), x)
    assert [n.TAG for n in traced.graph.nodes if n.TAG in set(tags)] == tags


@pytest.mark.parametrize("name", sorted(FORMS))
def test_op_kind_forms_match_pytorch(name: str) -> None:
    function, modules, tags = FORMS[name]
    x = torch.randn(3, 5, dtype=torch.float64) * 3
    traced = check_against_torch(Applied(function, modules), x)
    assert [n.TAG for n in traced.graph.nodes if n.TAG in set(tags)] == tags


def _spelled_forms(op: Any) -> bool:
    """An elementwise op kind with PyTorch forms and no hand-written FORMS entry: its forms
    are derived from its spelling (`SpelledForms`)."""
    from tlc.dialect.families import BinaryOp, UnaryOp

    return (
        issubclass(op, (UnaryOp, BinaryOp))
        and op.TORCH is not None
        and op.TAG not in FORMS
        and all(f.default is not None for f in op.FIELDS)
    )


def _dotted(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(__import__(module, fromlist=[attr]), attr)


class SpelledForms(nn.Module):
    """Every form an op kind's PyTorch spelling names, at the op's default metadata (passed by
    keyword as the spelling's `arguments`): each function on the tensors, each method on the
    first, each module built from the arguments; the results concatenated (so no other
    elementwise op joins them)."""

    def __init__(self, op: Any) -> None:
        super().__init__()
        spelling = op.TORCH
        self.args = {f.name: f.default for f in op.FIELDS if f.name in spelling.arguments}
        self.functions = [_dotted(n) for n in spelling.functions]
        self.methods = list(spelling.methods)
        self.layers = nn.ModuleList(_dotted(n)(**self.args) for n in spelling.modules)

    def apply(self, xs: list[torch.Tensor]) -> torch.Tensor:
        parts = [f(*xs, **self.args) for f in self.functions]
        parts += [getattr(xs[0], m)(*xs[1:], **self.args) for m in self.methods]
        parts += [layer(*xs) for layer in self.layers]
        return torch.cat(parts)


class UnaryForms(SpelledForms):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply([x])


class BinaryForms(SpelledForms):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.apply([x, y])


#: The op kinds whose forms are derived from their spelling.
SPELLED = {op.TAG: op for op in tlc.dialect.ops.FORWARD_OPS if _spelled_forms(op)}


@pytest.mark.parametrize("tag", sorted(SPELLED))
def test_spelled_forms_match_pytorch(tag: str) -> None:
    """Each form of the spelling imports as one node of the op kind (inputs drawn inside the
    op's DOMAIN); values agree with PyTorch in float64 (`check_against_torch`)."""
    op = SPELLED[tag]
    generator = torch.Generator().manual_seed(0)
    low = op.DOMAIN[0] + 0.1 if getattr(op, "DOMAIN", None) else None
    xs = [
        torch.randn(3, 5, dtype=torch.float64, generator=generator) * 3
        if low is None
        else low + 3 * torch.rand(3, 5, dtype=torch.float64, generator=generator)
        for _ in range(op.ARITY[0])
    ]
    forms = (UnaryForms if len(xs) == 1 else BinaryForms)(op)
    traced = check_against_torch(forms, *xs)
    count = len(forms.functions) + len(forms.methods) + len(forms.layers)
    made = [n.TAG for n in traced.graph.nodes if n.TAG not in ("input", "concat")]
    assert made == [tag] * count


class MaxAlongDim(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, 1)[0]


class ExpOut(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x, out=torch.empty(2, 4))


class AddAlpha(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.add(x, x, alpha=2)


class ClampByTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=x.relu())


def test_spelled_targets_refuse_what_the_spelling_does_not_name() -> None:
    """A derived rule knows the tensors and the spelling's `arguments`; anything else, or a call
    that is not the op (torch.max along a dim returns values and indices), is refused."""
    x = torch.randn(2, 4)
    assert _refusal(ExpOut(), x) == (
        "PyTorch graph import: FX node 'exp' (torch.exp): unsupported argument 'out'"
    )
    assert _refusal(MaxAlongDim(), x) == (
        "PyTorch graph import: FX node 'max_1' produced no single tensor"
    )
    assert _refusal(AddAlpha(), x) == (
        "PyTorch graph import: FX node 'add' (torch.add): alpha != 1"
    )
    assert _refusal(ClampByTensor(), x) == (
        "PyTorch graph import: FX node 'clamp' (torch.clamp): a tensor min bound (tl's clip "
        "bounds are numbers)"
    )


def test_refusals_of_the_real_model_rules() -> None:
    """Each refusal of the FX rules added for real models names the node, the target and why."""
    x = torch.randn(1, 4, 3)
    cases = [
        (
            lambda x, m: F.pad(x, (-1, 0), mode="reflect"),
            {},
            "FX node 'pad' (torch.nn.functional.pad): negative pads (cropping) with mode='reflect'",
        ),
        (
            lambda x, m: F.local_response_norm(x, 2),
            {},
            "FX node 'local_response_norm' (torch.nn.functional.local_response_norm): size=2: "
            "PyTorch's window for an even size starts one channel before ONNX's, which tl's lrn "
            "has",
        ),
        (
            lambda x, m: m["t"](x.reshape(4, 3)),
            {"t": nn.ConvTranspose1d(4, 2, 3)},
            "FX node 'layers_t' (torch.nn.modules.conv.ConvTranspose1d): an input without a "
            "batch axis",
        ),
        (
            lambda x, m: m["i"](x.reshape(4, 3)),
            {"i": nn.InstanceNorm1d(4)},
            "FX node 'layers_i' (torch.nn.modules.instancenorm.InstanceNorm1d): an input "
            "without a batch axis",
        ),
        (
            lambda x, m: F.normalize(x, p=1),
            {},
            "FX node 'normalize' (torch.nn.functional.normalize): p=1 (the Euclidean norm, p=2, "
            "only)",
        ),
        (
            lambda x, m: F.normalize(x, out=torch.empty(1, 4, 3)),
            {},
            "FX node 'normalize' (torch.nn.functional.normalize): unsupported argument 'out'",
        ),
        (
            lambda x, m: F.dropout(x, 0.1),
            {},
            "FX node 'dropout' (torch.nn.functional.dropout): dropout in training mode (call "
            ".eval() first)",
        ),
        (
            lambda x, m: torch.where(x > 0),
            {},
            # the one-argument form's shape depends on the values: the tracer refuses it
            "FX node 'where': its shape or value depends on the tensor values (the graph would "
            "hold only the example's)",
        ),
    ]
    for function, modules, message in cases:
        assert _refusal(Applied(function, modules), x) == f"PyTorch graph import: {message}"


def test_every_torch_spelling_is_imported() -> None:
    """Each callable an op kind's PyTorch spelling names is a target of the import table."""
    from tlc.dialect.registry import NODE_OPS
    from tlc.frontends.import_torch import DERIVED, RULES

    for op in NODE_OPS:
        if op.TORCH is not None:
            names = (*op.TORCH.functions, *op.TORCH.modules)
            assert all(any(_named(t, n) for t in RULES) for n in names), op.TAG
            assert set(op.TORCH.methods) <= set(RULES), op.TAG
    assert nn.LeakyReLU in DERIVED and F.leaky_relu in DERIVED and nn.GELU in DERIVED


def _named(target: object, dotted: str) -> bool:
    module, _, name = dotted.rpartition(".")
    return target is getattr(__import__(module, fromlist=[name]), name)


def test_parameters_keep_their_state_dict_names() -> None:
    """Payload fields that are the module's parameters or buffers are bound by their
    state_dict names in a `tl.params` section; the payload built from the state_dict by those
    names is the imported payload."""
    from tlc.dialect.program_ops import ParamsOp
    from tlc.semantics.program_run import payload_from_params

    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2)).eval()
    traced = tlc.from_torch(model, torch.randn(3, 4))
    (binding,) = [op for op in traced.module.ops if isinstance(op, ParamsOp)]
    state = {k: v.double().numpy() for k, v in model.state_dict().items()}
    state.pop("1.num_batches_tracked")
    assert sorted(binding.declared) == sorted(state)
    by_name = payload_from_params(traced.module, traced.graph.graph_name, state)
    for node_id, record in traced.payload.records.items():
        for field, value in record.items():
            if field != "eps":
                np.testing.assert_array_equal(by_name.records[node_id][field], value)


def test_params_file_fills_the_named_fields_over_the_inline_record(tmp_path: Path) -> None:
    """A batch norm without affine parameters: mean and var are buffers (named), gamma and
    beta the importer's ones and zeros (unnamed); `--params` replaces only the named fields."""
    from xdsl.dialects.builtin import ModuleOp

    from tlc.dialect.payload_section import payload_op
    from tlc.tools.run_program import params_payload

    model = nn.Sequential(nn.BatchNorm1d(3, affine=False)).eval()
    traced = tlc.from_torch(model, torch.randn(2, 3))
    bindings = [op.clone() for op in traced.module.ops if op is not traced.graph]
    graph = traced.graph.clone()
    module = ModuleOp([graph, payload_op(graph.graph_name, traced.payload), *bindings])
    path = tmp_path / "p.npz"
    np.savez(path, **{"0.running_mean": np.arange(3.0), "0.running_var": np.full(3, 2.0)})
    (record,) = params_payload(module, graph, str(path)).records.values()
    np.testing.assert_array_equal(record["mean"], np.arange(3.0))
    np.testing.assert_array_equal(record["var"], np.full(3, 2.0))
    np.testing.assert_array_equal(record["gamma"], np.ones(3))
