"""A graph's kernel plan as IR attributes: what `select-kernels` writes and the printers show.

The plan is metadata, not code: each node that needs runtime work carries the name of its kernel
capsule in the discardable attribute `tl.kernel` (`"reference.linear"`), and the graph carries
the policy it was planned under in `tl.kernel_policy` (device, provider, allow_trusted_external).
The names are dialect-prefixed so they never collide with an op's own metadata (pooling ops have
a `kernel` field). In .tlir the plan reads

    tl.graph @mlp kernel_policy {device = "cpu", provider = "auto",
                                 allow_trusted_external = false} {
      %1 = linear(%0) : [5] kernel "reference.linear"

(one line in the printed form).

What the names mean (capsules, providers, admissibility) is `tlc.semantics.capsules`' business.
"""

from __future__ import annotations

from xdsl.dialects.builtin import BoolAttr, DictionaryAttr, IntegerAttr, StringAttr
from xdsl.ir import Operation

KERNEL_ATTR = "tl.kernel"
POLICY_ATTR = "tl.kernel_policy"

#: The policy's fields and their Python types, in printing order.
POLICY_FIELDS: dict[str, type] = {"device": str, "provider": str, "allow_trusted_external": bool}

Policy = dict[str, str | bool]


def kernel_of(node: Operation) -> str | None:
    attr = node.attributes.get(KERNEL_ATTR)
    return None if attr is None else attr.data if isinstance(attr, StringAttr) else None


def set_kernel(node: Operation, name: str | None) -> None:
    """Attach capsule `name` to `node`; None removes a previous plan's capsule."""
    if name is None:
        node.attributes.pop(KERNEL_ATTR, None)
    else:
        node.attributes[KERNEL_ATTR] = StringAttr(name)


def policy_of(graph: Operation) -> Policy | None:
    """The policy the graph was planned under, or None if it was never planned."""
    attr = graph.attributes.get(POLICY_ATTR)
    if not isinstance(attr, DictionaryAttr):
        return None
    policy: Policy = {}
    for name, value in attr.data.items():
        if isinstance(value, StringAttr):
            policy[name] = value.data
        elif isinstance(value, IntegerAttr):
            policy[name] = bool(value.value.data)
    return policy


def set_policy(graph: Operation, policy: Policy) -> None:
    graph.attributes[POLICY_ATTR] = DictionaryAttr(
        {
            name: BoolAttr.from_bool(value) if isinstance(value, bool) else StringAttr(value)
            for name, value in policy.items()
        }
    )


def check_policy_field(name: str, value: object) -> str | None:
    """Why `name = value` in a parsed `kernel_policy {...}` is malformed, or None."""
    expected = POLICY_FIELDS.get(name)
    if expected is None:
        return f"unknown kernel policy field '{name}' (known: {', '.join(POLICY_FIELDS)})"
    if not isinstance(value, expected):
        kind = "a string" if expected is str else "true or false"
        return f"kernel policy field '{name}' must be {kind}"
    return None


def quote(text: str) -> str:
    """A .tlir string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fmt_policy(policy: Policy) -> str:
    """The .tlir text `{device = "cpu", provider = "auto", allow_trusted_external = false}`."""

    def value(v: str | bool) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return quote(v)

    known = [n for n in POLICY_FIELDS if n in policy]
    ordered = known + [n for n in policy if n not in POLICY_FIELDS]  # others: from MLIR input
    return "{" + ", ".join(f"{n} = {value(policy[n])}" for n in ordered) + "}"
