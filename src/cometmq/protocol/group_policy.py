"""RocketMQ 5's GroupRetryPolicy (a subscription group's ``groupRetryPolicy``), checked the same way by the broker
that stores it and the admin CLI that sends it (``updateSubGroup -p``)."""

from __future__ import annotations

from typing import Any

POLICY_KEYS = {"EXPONENTIAL": ("exponentialRetryPolicy", {"initial", "max", "multiplier"}),
               "CUSTOMIZED": ("customizedRetryPolicy", {"next"})}


def check_retry_policy(policy: object) -> dict[str, Any]:
    """A GroupRetryPolicy as JSON, checked (ValueError names what is wrong): its type, and the policy of that
    type if given (EXPONENTIAL: positive initial, max and multiplier; CUSTOMIZED: a list of positive delays)."""
    if not isinstance(policy, dict):
        raise ValueError("groupRetryPolicy must be an object")
    kind = policy.get("type", "CUSTOMIZED")
    if kind not in POLICY_KEYS:
        raise ValueError(f"groupRetryPolicy type {kind!r} is not EXPONENTIAL or CUSTOMIZED")
    unknown = set(policy) - {"type", "exponentialRetryPolicy", "customizedRetryPolicy"}
    if unknown:
        raise ValueError(f"groupRetryPolicy has unknown keys {sorted(unknown)}")
    for name, keys in POLICY_KEYS.values():
        sub = policy.get(name)
        if sub is None:
            continue
        if not isinstance(sub, dict) or set(sub) - keys:
            raise ValueError(f"groupRetryPolicy {name} must be an object with {sorted(keys)}")
        for key, value in sub.items():
            values = value if key == "next" else [value]
            if not isinstance(values, list) or not values or any(
                    isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
                raise ValueError(f"groupRetryPolicy {name}.{key} must be "
                                 + ("a list of positive integers (ms)" if key == "next" else "a positive integer"))
    return {"type": kind, **{k: v for k, v in policy.items() if k != "type" and v is not None}}
